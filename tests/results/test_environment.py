"""What a record says about where it ran, and what a run says when that changes: a resumed run
in another environment warns on its first line and keeps both; records from a changed device
environment are noted; kinds route by exact kind or family; the interpreter is refused on GPUs."""

import json

import pytest
import torch

from attnbench import cli
from attnbench.execution.case_runner import served_kinds
from attnbench.hardware.device import interpreter_on_gpu
from attnbench.resources import ENV_FAMILY, ENV_KIND, node_resources
from attnbench.results import store
from attnbench.results.records import make_record
from attnbench.sweep.load import load_sweep

SWEEP = "name: envtest\ndefaults: {backend: naive, seqlen_q: 16, heads_q: 2, head_dim: 8}\n" \
        "axes: {seed: [0, 1]}\n"


def _env(**software):
    base = {"torch": "2.13.0", "driver_version": "570.1", "cuda_runtime": "12.8", "commit": "a",
            "dirty": False}
    return {"host": "h", "device": "cuda:0", "gpu_kind": "H100-SXM5-80GB",
            "identity": {"sm_clock_max_mhz": 1980, "power_limit_w": 700.0},
            "software": {**base, **software}}


@pytest.fixture
def sweep_file(tmp_path):
    path = tmp_path / "envtest.yaml"
    path.write_text(SWEEP)
    return path


def test_resumed_run_in_another_environment_warns_first_and_keeps_both(tmp_path, sweep_file,
                                                                       monkeypatch, capsys):
    versions = {"python": "3.11", "torch": "2.13.0", "attnbench": "0.1.0", "commit": "aaa",
                "dirty": False}
    monkeypatch.setattr(store, "client_environment", lambda: dict(versions))
    run = store.RunStore(tmp_path / "run", load_sweep(sweep_file), command=["t"])
    assert run.resume_note == ""
    for case in run.sweep.cases:
        run.append(make_record(case, verdict="pass"))
    run.close()
    monkeypatch.setattr(store, "client_environment",
                        lambda: dict(versions, torch="2.14.0", commit="bbb"))
    assert cli.main(["run", str(sweep_file), "--out", str(tmp_path / "run"),
                     "--no-report"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("attnbench: warning: this run was started in another environment")
    assert "torch: 2.13.0 -> 2.14.0" in err[0] and "commit" in err[0]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["versions"]["torch"] == "2.13.0"              # where it began
    assert manifest["resumed"][-1]["versions"]["torch"] == "2.14.0"  # and where it went on


def test_a_record_from_a_changed_device_environment_is_noted(tmp_path, sweep_file):
    run = store.RunStore(tmp_path / "run", load_sweep(sweep_file), command=["t"])
    first, second = run.sweep.cases
    assert run.append(make_record(first, verdict="pass", env=_env())) is None
    note = run.append(make_record(second, verdict="pass", env=_env(driver_version="580.2")))
    assert note and "driver: 570.1 -> 580.2" in note
    other_kind = dict(_env(torch="2.14.0"), gpu_kind="A100-SXM4-80GB")
    assert run._note_env(other_kind) is None  # another kind is another environment by design
    run.close()


def test_workers_advertise_exact_kind_and_family_and_ranks_serve_both(monkeypatch):
    assert node_resources("H100-SXM5-80GB", 8, "H100") == {
        "device": 8, "kind-H100-SXM5-80GB": 8, "kind-H100": 8}
    assert node_resources("cpu", 2, "cpu") == {"device": 2, "kind-cpu": 2}
    monkeypatch.setenv(ENV_KIND, "H100-SXM5-80GB")
    monkeypatch.setenv(ENV_FAMILY, "H100")
    assert served_kinds({"gpu_kind": "cpu"}) == {"H100-SXM5-80GB", "H100"}
    monkeypatch.delenv(ENV_KIND)
    assert served_kinds({"gpu_kind": "H200-SXM-141GB", "gpu_family": "H200"}) == {
        "H200-SXM-141GB", "H200"}


def test_triton_interpreter_is_refused_on_a_cuda_device(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "TRITON_INTERPRET=1 is set on a CUDA worker" in interpreter_on_gpu(
        torch.device("cuda", 0))
    assert interpreter_on_gpu(torch.device("cpu")) is None
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert interpreter_on_gpu(torch.device("cuda", 0)) is None


def test_a_gpu_worker_refuses_an_inherited_triton_interpreter(monkeypatch):
    from attnbench.cluster.worker import DetectionError, detect_node

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(DetectionError, match="TRITON_INTERPRET=1 is set on a node with GPUs"):
        detect_node(gpus=[("0", "NVIDIA H100 80GB HBM3")])
    assert detect_node(slots=1, gpus=[]).kind == "cpu"  # a CPU node runs the interpreter
