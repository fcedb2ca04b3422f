"""Exact hardware identity (NVML from recorded fixtures), kinds, peaks, software environment."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from attnbench.hardware import (CPU_KIND, KIND_PATTERN, KINDS, PEAKS, DeviceIdentity,
                                backend_fingerprint, environment_differences, gpu_kind,
                                kind_from_name, measure_matmul_peak, peak_bandwidth_gbs,
                                peak_tflops, read_identities, read_identity, software_environment,
                                git_state)
from attnbench.hardware.nvml_replay import (NVML_ERROR_LIBRARY_NOT_FOUND, ReplayNvml,
                                            torch_properties)
from helpers import DATA

FIXTURES = sorted((DATA / "nvml").glob("*.json"))
REQUIRED = {"h100_sxm5_80gb", "h100_pcie_80gb", "h100_nvl_94gb", "h200_sxm_141gb",
            "h200_nvl_141gb", "gh200_96gb", "a100_sxm4_80gb", "a100_pcie_40gb", "l40", "l40s",
            "l4", "rtx_4090", "rtx_3090", "b200"}


def load(stem: str) -> dict:
    return json.loads((DATA / "nvml" / f"{stem}.json").read_text())


def identity_of(recording: dict, **replay) -> DeviceIdentity:
    return read_identity(0, nvml=ReplayNvml(recording, **replay),
                         properties=torch_properties(recording))


@pytest.fixture(autouse=True)
def _no_visible_devices(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_every_required_card_has_a_fixture():
    assert REQUIRED <= {path.stem for path in FIXTURES}


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_fixture_classifies_to_its_kind_and_peak(path):
    recording = json.loads(path.read_text())
    expected = recording["expected"]
    identity = identity_of(recording)
    device = recording["devices"][0]
    kind = gpu_kind(identity)
    assert (kind.kind, kind.family, kind.form_factor) == (
        expected["kind"], expected["family"], expected["form_factor"])
    assert kind.known and KIND_PATTERN.match(kind.kind)
    assert peak_tflops(kind, "bf16") == expected["bf16_tflops"]
    assert peak_bandwidth_gbs(kind) > 0
    assert identity.name == device["nvmlDeviceGetName"]
    assert identity.pci_device_id == int(device["nvmlDeviceGetPciInfo"]["pciDeviceId"], 16) >> 16
    assert identity.form_factor == expected["form_factor"]
    assert identity.sm_count == recording["torch"][0]["multi_processor_count"]
    assert identity.memory_total_bytes == device["nvmlDeviceGetMemoryInfo"]["total"]
    assert identity.sm_clock_max_mhz == device["nvmlDeviceGetMaxClockInfo"]["sm"]
    assert identity.power_limit_w == device["nvmlDeviceGetPowerManagementLimit"] / 1000
    assert re.fullmatch(r"\d+\.\d+", identity.compute_capability)
    assert re.fullmatch(r"\d+\.\d+", identity.cuda_driver_version)
    # The same kind from what the Dask worker has: nvidia-smi's name, memory.total, pci.device_id.
    smi = kind_from_name(device["nvmlDeviceGetName"],
                         f"{device['nvmlDeviceGetMemoryInfo']['total'] // 2**20} MiB",
                         device["nvmlDeviceGetPciInfo"]["pciDeviceId"])
    assert smi == kind
    # And from name and memory alone, as if the PCI id were one the table does not know.
    assert kind_from_name(device["nvmlDeviceGetName"],
                          device["nvmlDeviceGetMemoryInfo"]["total"] // 2**20, 0xFFFF) == kind
    # The record form is JSON and comes back whole.
    stored = json.loads(json.dumps(identity.to_dict()))
    assert DeviceIdentity.from_dict(stored) == identity


def test_h100_pcie_and_sxm_are_different_kinds_with_different_peaks():
    sxm, pcie = (gpu_kind(identity_of(load(s))) for s in ("h100_sxm5_80gb", "h100_pcie_80gb"))
    assert sxm.kind != pcie.kind and sxm.family == pcie.family == "H100"
    assert peak_tflops(pcie, "bf16") < peak_tflops(sxm, "bf16")


@pytest.mark.parametrize("stem", ["h100_nvl_94gb", "h200_nvl_141gb"])
def test_nvl_cards_do_not_get_the_sxm_peak(stem):
    kind = gpu_kind(identity_of(load(stem)))
    assert kind.form_factor == "NVL"
    assert peak_tflops(kind, "bf16") == pytest.approx(835.5)
    assert peak_tflops(kind, "bf16") < peak_tflops("H100-SXM5-80GB", "bf16")


@pytest.mark.parametrize("name, pci", [("NVIDIA GH200 480GB", None), ("NVIDIA GH200 120GB", None),
                                       ("NVIDIA GH200 144G HBM3e", None),
                                       ("NVIDIA GH200 480GB", "0x234210DE")])
def test_gh200_is_not_an_h200(name, pci):
    kind = kind_from_name(name, pci_device_id=pci)
    assert kind.family == "GH200" and kind.kind.startswith("GH200-")
    assert kind_from_name(name).kind != kind_from_name("NVIDIA H200").kind


def test_each_geforce_card_is_its_own_kind():
    names = ["NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090 D", "NVIDIA GeForce RTX 3090",
             "NVIDIA GeForce RTX 3090 Ti", "NVIDIA GeForce RTX 4070 Ti SUPER",
             "NVIDIA GeForce RTX 5090", "NVIDIA GeForce RTX 4060 Ti"]
    kinds = [kind_from_name(n) for n in names]
    assert len({k.kind for k in kinds}) == len(names)
    assert [k.family for k in kinds] == ["GeForce-Ada", "GeForce-Ada", "GeForce-Ampere",
                                         "GeForce-Ampere", "GeForce-Ada", "GeForce-Blackwell",
                                         "GeForce-Ada"]
    assert kind_from_name("NVIDIA GeForce RTX 4070 Ti SUPER").kind == "RTX-4070-Ti-SUPER"
    assert peak_tflops(kinds[1], "bf16") is None  # a 4090 D is not a 4090


def test_l40_l40s_and_l4_never_match_each_other():
    assert kind_from_name("NVIDIA L40").kind == "L40"
    assert kind_from_name("NVIDIA L40S").kind == "L40S"
    assert kind_from_name("NVIDIA L4").kind == "L4"
    assert kind_from_name("NVIDIA L40G").kind == "L40G"  # unknown, not an L40
    assert peak_tflops("L40S", "bf16") == pytest.approx(2 * peak_tflops("L40", "bf16"), rel=1e-3)


@pytest.mark.parametrize("name, memory_mib, pci, kind", [
    ("NVIDIA A100-SXM4-40GB", None, None, "A100-SXM4-40GB"),
    ("NVIDIA A100 80GB PCIe", None, None, "A100-PCIe-80GB"),
    ("NVIDIA A100-PCIE-40GB", None, "0x20B110DE", "A100-PCIe-40GB"),  # the older device id
    ("NVIDIA A100-SXM4-80GB", 81920, None, "A100-SXM4-80GB"),
    ("NVIDIA H100", 96000, "0x233910DE", "H100-SXM5-94GB"),  # unknown variant: own kind
    ("NVIDIA H100 80GB HBM3", None, None, "H100-SXM5-80GB"),
    ("Tesla V100-SXM2-32GB", 32510, None, "V100-SXM2-32GB"),
    ("NVIDIA B200", 183359, "0x290110DE", "B200"),
    ("NVIDIA GB200", None, None, "GB200"),
    ("NVIDIA Mystery 9000", None, None, "Mystery-9000"),
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", 4864, None, "A100-SXM4-40GB-MIG-1g.5gb"),
    ("cpu", None, None, CPU_KIND),
])
def test_kind_from_name(name, memory_mib, pci, kind):
    assert kind_from_name(name, memory_mib, pci).kind == kind


def test_pci_id_names_the_sku_whatever_the_driver_calls_it():
    # An older driver named the H100 NVL "NVIDIA H100 PCIe"; its device id says what it is.
    assert kind_from_name("NVIDIA H100 PCIe", "95830 MiB", "0x232110DE").kind == "H100-NVL-94GB"


def test_kinds_are_valid_resource_names():
    made = [kind_from_name(n).kind for n in ("NVIDIA RTX PRO 6000 Blackwell Server Edition",
                                             "NVIDIA A100-SXM4-40GB MIG 3g.20gb", "Weird/GPU (x)")]
    for kind in (*KINDS, *made, CPU_KIND):
        assert KIND_PATTERN.match(kind), kind
    assert set(PEAKS) <= set(KINDS)


def test_peaks_table_lookups():
    assert peak_tflops("H100-SXM5-80GB", "bf16") == 989.4
    assert peak_tflops("H100-PCIe-80GB", "torch.bfloat16") == 756.0
    assert peak_tflops("A100-SXM4-80GB", "fp8") is None  # no fp8 on Ampere
    assert peak_tflops("RTX-4090", "fp16") == 165.2  # fp32 accumulation, as attention runs
    assert peak_tflops("unknown-gpu", "bf16") is None and peak_bandwidth_gbs("cpu") is None
    assert peak_bandwidth_gbs("H200-SXM-141GB") == 4800


def test_nvml_refusals_become_none_fields_not_exceptions():
    failing = {"nvmlDeviceGetPowerManagementLimit", "nvmlDeviceGetEccMode",
               "nvmlDeviceGetMaxClockInfo", "nvmlSystemGetDriverVersion", "nvmlDeviceGetPciInfo"}
    nvml = ReplayNvml(load("h100_sxm5_80gb"), fail=failing)
    identity = read_identity(0, nvml=nvml)
    assert identity.power_limit_w is None and identity.ecc_enabled is None
    assert identity.sm_clock_max_mhz is None and identity.driver_version is None
    assert identity.pci_device_id is None and identity.pci_subsystem_id is None
    assert identity.sm_count is None  # no torch properties given, CUDA not started
    assert identity.memory_total_bytes is not None and identity.uuid is not None
    assert len(identity.unreadable) == 6  # two max clocks and four others
    assert gpu_kind(identity).kind == "H100-SXM5-80GB"  # name and memory still decide
    assert nvml.open == 0  # every nvmlInit matched by nvmlShutdown


def test_an_empty_recording_still_gives_an_identity():
    identity = read_identity(0, nvml=ReplayNvml({"devices": [{}]}))
    assert identity.device_type == "cuda" and identity.name == "unknown GPU"
    assert identity.memory_total_bytes is None and len(identity.unreadable) > 10


def test_without_nvml_the_device_is_the_cpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    identity = read_identity()
    assert identity.device_type == "cpu" and gpu_kind(identity).kind == CPU_KIND
    assert read_identities() == []
    no_driver = ReplayNvml(load("l4"), init_error=NVML_ERROR_LIBRARY_NOT_FOUND)
    assert read_identity(nvml=no_driver).device_type == "cpu"


def test_real_pynvml_on_this_machine_never_raises():
    pytest.importorskip("pynvml")
    identity = read_identity()
    assert identity.device_type in ("cpu", "cuda")


def test_cuda_visible_devices_selects_the_nvml_device(monkeypatch):
    two = {"devices": [load("h100_sxm5_80gb")["devices"][0], load("l4")["devices"][0]]}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert read_identity(0, nvml=ReplayNvml(two)).name == "NVIDIA L4"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-00000000-0000-4000-8000-00000000001")
    assert read_identity(0, nvml=ReplayNvml(two)).name == "NVIDIA L4"  # a UUID prefix (...0011)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-00000000-0000-4000-8000-000000000001")
    assert read_identity(0, nvml=ReplayNvml(two)).name == "NVIDIA H100 80GB HBM3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert read_identity(0, nvml=ReplayNvml(two)).device_type == "cpu"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    # torch's properties carry the UUID (without "GPU-"): that decides, whatever the order.
    l4 = SimpleNamespace(name="NVIDIA L4", multi_processor_count=58, major=8, minor=9,
                         uuid="00000000-0000-4000-8000-000000000011")
    assert read_identity(0, nvml=ReplayNvml(two), properties=l4).sm_count == 58
    assert read_identity(0, nvml=ReplayNvml(two), properties=l4).name == "NVIDIA L4"
    assert [i.name for i in read_identities(nvml=ReplayNvml(two))] == [
        "NVIDIA H100 80GB HBM3", "NVIDIA L4"]


def test_environment_differences_name_what_changed():
    identity = identity_of(load("h100_sxm5_80gb"))
    env = {"software": {"torch": "2.11.0", "triton": "3.6.0", "cudnn": "9.10.2", "commit": "abc",
                        "dirty": False, "driver_version": identity.driver_version},
           "device": identity.to_dict(), "kind": "H100-SXM5-80GB"}
    assert environment_differences(env, json.loads(json.dumps(env))) == []
    upgraded = json.loads(json.dumps(env))
    upgraded["software"]["driver_version"] = "580.65.06"
    upgraded["device"]["driver_version"] = "580.65.06"
    assert environment_differences(env, upgraded) == ["driver: 565.57.01 -> 580.65.06"]
    upgraded["kind"] = "H100-PCIe-80GB"
    upgraded["device"]["power_limit_w"] = 350.0
    changes = environment_differences(env, upgraded)
    assert [line.split(":")[0] for line in changes] == ["driver", "kind", "power limit"]
    assert environment_differences({"torch": "2.4"}, {}) == []  # not recorded: not compared


def test_software_environment_on_this_machine():
    started = time.perf_counter()
    env = software_environment()
    assert time.perf_counter() - started < 10
    assert env["python"] == ".".join(map(str, sys.version_info[:3]))
    assert env["torch"] and env["triton"]
    assert re.fullmatch(r"[0-9a-f]{40}", env["commit"])  # tests run in a checkout
    assert isinstance(env["dirty"], bool)
    json.dumps(env)


def test_git_state_records_the_commit_date_history_orders_by():
    """``commit_date`` is the committer date of HEAD (``attnbench history`` orders by it)."""
    from datetime import datetime

    from attnbench.hardware.software import PACKAGE_DIR

    state = git_state()
    expected = subprocess.run(["git", "-C", str(PACKAGE_DIR),
                               "show", "-s", "--format=%cI", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
    assert state["commit_date"] == expected
    assert datetime.fromisoformat(state["commit_date"]).tzinfo is not None
    assert git_state(Path("/")) == {"commit": None, "commit_date": None, "dirty": None}


def test_backend_fingerprint():
    from attnbench.backends import sdpa

    ours = backend_fingerprint(sdpa)
    assert ours["module"] == "attnbench.backends.sdpa" and ours["distribution"] == "attnbench"
    assert re.fullmatch(r"[0-9a-f]{12}", ours["source_sha256"])
    loose = backend_fingerprint(test_backend_fingerprint)  # a file no distribution installed
    assert loose["distribution"] is None and loose["version"] is None
    assert loose["source_sha256"] == backend_fingerprint(sys.modules[__name__])["source_sha256"]


def test_matmul_peak_is_empty_on_cpu_and_quick():
    started = time.perf_counter()
    assert measure_matmul_peak("cpu") == {}
    assert time.perf_counter() - started < 0.5


@pytest.mark.gpu
def test_matmul_peak_on_a_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    peaks = measure_matmul_peak(0, seconds=0.5)
    kind = gpu_kind(read_identity(0))
    for dtype, measured in peaks.items():
        assert measured > 0
        datasheet = peak_tflops(kind, dtype)
        if datasheet:
            assert measured < 1.25 * datasheet, (kind, dtype, measured, datasheet)  # boost margin


def test_a_rank_records_the_sm_count_of_its_gpu(monkeypatch):
    """The rank's first record is written before any tensor exists, when CUDA is not started
    yet: ``read_identity`` alone found no torch properties there and every record said
    ``sm_count: null``. ``device_env`` now hands torch's properties over (mutant: drop them ->
    None). NVML from the H200 recording; torch's properties a stand-in with the recorded SM
    count (132) and the recording's UUID, so the handle is found by UUID as on a real rank."""
    from attnbench.hardware import device as device_module
    from attnbench.hardware import nvml as nvml_module

    torch = pytest.importorskip("torch")
    recording = load("h200_sxm_141gb")
    nvml = ReplayNvml(recording)
    fake = SimpleNamespace(**recording["torch"][0], total_memory=141 * 2**30,
                           uuid=recording["devices"][0]["nvmlDeviceGetUUID"].removeprefix("GPU-"))
    asked = []
    monkeypatch.setattr(nvml_module, "load_nvml", lambda given=None: nvml)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: asked.append(index) or fake)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # a rank's first record
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: fake.name)
    monkeypatch.setattr(device_module, "_identity", {})
    env = device_module.device_env(torch.device("cuda", 0))
    assert asked == [0]
    assert env["identity"]["sm_count"] == 132 and env["gpu_kind"] == "H200-SXM-141GB"
    assert env["identity"]["uuid"] == recording["devices"][0]["nvmlDeviceGetUUID"]
    assert nvml.open == 0
