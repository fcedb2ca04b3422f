"""Where a case goes, in process: :func:`attnbench.cluster.connect.plan_case` asks for the
devices and kind a case needs (or says why no worker can run it), device leases are exclusive,
aligned and wait for release, and a node's kind is detected (mixed nodes refused)."""

from __future__ import annotations

import threading
import time

import pytest

from attnbench.cluster.connect import WorkerInfo, plan_case
from attnbench.cluster.worker import DetectionError, DeviceLeases, LeaseTimeout, detect_node
from attnbench.cluster.worker import worker_main
from attnbench.sweep.case import Case
from cluster_rig import worker_infos




@pytest.mark.parametrize("case, workers, expected", [
    (Case(backend="naive", gpu="H100", cp=2), worker_infos(("H100", 8)),
     {"device": 2, "kind-H100": 2}),
    (Case(backend="naive", gpu="any", tp=4), worker_infos(("A100", 2), ("H100", 4)), {"device": 4}),
    # CPU workers run more ranks than they have slots, the ranks sharing the slots.
    (Case(backend="naive", gpu="any", cp=4), worker_infos(("cpu", 2)),
     {"device": 2, "kind-cpu": 2}),
    (Case(backend="naive", gpu="cpu", cp=2), worker_infos(("cpu", 1)),
     {"device": 1, "kind-cpu": 1}),
], ids=["kind", "any", "cpu-oversubscribed", "cpu-kind-oversubscribed"])
def test_plan_case_asks_for_what_the_case_needs(case, workers, expected):
    assert plan_case(case, workers) == (expected, "")


@pytest.mark.parametrize("case, workers, reason", [
    (Case(backend="naive", gpu="H100"), worker_infos(("cpu", 2), ("cpu", 2)),
     "no worker offers GPU kind 'H100' (workers: 2 x cpu with 2 devices)"),
    (Case(backend="naive", gpu="H100", cp=2, tp=4), worker_infos(("H100", 4)),
     "cp=2 x tp=4 needs 8 devices of kind H100 on one worker; the largest offers 4 "
     "(workers: 1 x H100 with 4 devices)"),
    (Case(backend="naive", gpu="any", cp=2), worker_infos(("H100", 1)),
     "cp=2 x tp=1 needs 2 devices on one worker; the largest offers 1 "
     "(workers: 1 x H100 with 1 device)"),
    (Case(backend="naive"), [WorkerInfo("tcp://x:1", "plain", {})],
     "cp=1 x tp=1 needs 1 devices on one worker; the largest offers 0 (workers: 1 without "
     "attnbench resources (start workers with `attnbench worker`))"),
    (Case(backend="naive"), [], "no workers connected"),
], ids=["kind-missing", "too-few-devices", "any-too-few", "plain-dask-worker", "none"])
def test_plan_case_says_why_no_worker_can_run_a_case(case, workers, reason):
    assert plan_case(case, workers) == (None, reason)


def test_leases_are_exclusive_aligned_and_wait_for_release():
    leases = DeviceLeases([str(i) for i in range(8)], kind="H100", gpu=True)
    with leases.lease(2) as a, leases.lease(4) as b, leases.lease(1) as c:
        assert a.ids == ("0", "1") and b.ids == ("4", "5", "6", "7") and c.ids == ("2",)
        assert b.pool_env(4) == [{"CUDA_VISIBLE_DEVICES": d} for d in "4567"]
        with pytest.raises(LeaseTimeout, match="not free after 0.05 s"):
            with leases.lease(2, timeout=0.05):
                pass
        got = []
        waiter = threading.Thread(target=lambda: got.append(leases.lease(4).__enter__().ids))
        waiter.start()
        time.sleep(0.1)
        assert not got  # 3 free, 4 wanted: it waits
    waiter.join(timeout=5)
    assert got == [("0", "1", "2", "3")]
    cpu = DeviceLeases(["0", "1"], kind="cpu", gpu=False)
    with cpu.lease(1) as slot:
        assert slot.pool_env(1) is None  # CPU slots: any warm pool serves


def test_lease_table_of_a_plain_dask_worker_comes_from_its_resources():
    table = DeviceLeases.from_environment({"CUDA_VISIBLE_DEVICES": "4,5"},
                                          {"device": 2.0, "kind-H100": 2.0})
    assert (table.ids, table.kind, table.gpu) == (("4", "5"), "H100", True)
    table = DeviceLeases.from_environment({}, {"device": 3.0, "kind-cpu": 3.0})
    assert (table.ids, table.kind, table.gpu) == (("0", "1", "2"), "cpu", False)


def test_detect_node_names_the_kind_and_refuses_mixed_nodes(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # this CPU test box interprets
    node = detect_node(gpus=[("0", "NVIDIA H100 80GB HBM3"), ("1", "NVIDIA H100 80GB HBM3")])
    assert node.gpu and node.kind == "H100-SXM5-80GB" and node.resources == {
        "device": 2, "kind-H100-SXM5-80GB": 2, "kind-H100": 2}
    # nvidia-smi's extra columns (memory, PCI device id) tell an H100 PCIe from an SXM
    pcie = detect_node(gpus=[("0", "NVIDIA H100 PCIe", "81559 MiB", "0x233110DE")])
    assert pcie.kind == "H100-PCIe-80GB" and pcie.family == "H100"
    cpu = detect_node(kind="A", gpus=[])
    assert (cpu.kind, cpu.detected_kind, cpu.gpu) == ("A", "cpu", False)
    assert detect_node(slots=3, gpus=[]).resources == {"device": 3, "kind-cpu": 3}
    with pytest.raises(DetectionError,
                       match="several kinds.*H100-PCIe-80GB: CUDA_VISIBLE_DEVICES=0"):
        detect_node(gpus=[("0", "NVIDIA H100 PCIe"), ("1", "NVIDIA A100-SXM4-80GB")])
    with pytest.raises(DetectionError, match="--kind"):
        detect_node(kind="H 100", gpus=[])


def test_worker_command_line_passes_unknown_options_to_dask(capsys):
    # As dask-jobqueue calls it: address first, then its own options.
    assert worker_main(["tcp://10.0.0.1:8786", "--name", "job-1", "--nthreads", "4",
                        "--memory-limit", "8GB", "--death-timeout", "60", "--kind", "A",
                        "--slots", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("-m distributed.cli.dask_worker tcp://10.0.0.1:8786 --nthreads 4 "
                           "--resources 'device=2 kind-A=2' --nanny --preload "
                           "attnbench.cluster.plugin --name job-1 --memory-limit 8GB "
                           "--death-timeout 60")
    assert "ATTNBENCH_KIND=A" in out and "ATTNBENCH_DEVICE_TYPE=cpu" in out
    assert worker_main(["--slots", "1"]) == 2
    assert "give the scheduler's address" in capsys.readouterr().err


