"""Simulated GPUs (attnbench/cluster/simulation.py): a real scheduler and an `attnbench worker
--simulate-gpus` on loopback, and the lease-overlap check the scale benchmark relies on, shown
to catch a lease table that hands a device out twice."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest

from attnbench.cluster.simulation import lease_overlaps
from attnbench.cluster.worker import DeviceLeases
from cluster_rig import Processes, wait_for
from helpers import ROOT, attnbench_cmd


def _lease_records(leases: DeviceLeases, threads: int = 12, rounds: int = 5) -> list[dict]:
    """Threads that lease 1 or 2 devices, hold them briefly and note when (as simulated cases
    do)."""
    records, lock = [], threading.Lock()

    def work(i: int) -> None:
        for _ in range(rounds):
            with leases.lease(1 + i % 2) as lease:
                start = time.time()
                time.sleep(0.005)
                end = time.time()
            with lock:
                records.append({"env": {"worker": "w", "lease": list(lease.ids),
                                        "lease_start": start, "lease_end": end}})

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return records


def test_the_lease_table_never_hands_a_device_out_twice():
    records = _lease_records(DeviceLeases([str(i) for i in range(4)], kind="SIM", gpu=False))
    assert len(records) == 60 and lease_overlaps(records) == 0


def test_the_overlap_check_catches_a_lease_table_that_forgets_what_it_handed_out():
    class Forgetful(DeviceLeases):
        def _pick(self, count):  # the bug: ignores what is in use
            return self.ids[:count]

    records = _lease_records(Forgetful([str(i) for i in range(4)], kind="SIM", gpu=False))
    assert lease_overlaps(records) > 0


def test_a_simulated_worker_runs_a_sweep_with_plausible_records(tmp_path):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    sweep = tmp_path / "sim.yaml"
    sweep.write_text(json.dumps({"name": "sim", "defaults": {"backend": "naive", "gpu": "SIM-X",
                                                             "heads_q": 8},
                                 "axes": {"tp": [1, 2], "seed": list(range(20))}}))
    procs = Processes(tmp_path, env)
    try:
        address = procs.scheduler("scheduler")
        procs.start("sim", [*attnbench_cmd(), "worker", "--scheduler", address, "--name", "sim",
                            "--kind", "SIM-X", "--simulate-gpus", "8", "--case-seconds", "0.05",
                            "--no-nanny", "--no-dashboard"])
        log = tmp_path / "sim.log"
        wait_for(lambda: "Registered to" in log.read_text(), 90, "the simulated worker")
        assert "8 simulated GPUs of kind SIM-X, cases take 0.05 s" in log.read_text()
        out = tmp_path / "run"
        run = subprocess.run([*attnbench_cmd(), "run", str(sweep), "--out", str(out),
                              "--scheduler", address, "--no-report"], capture_output=True,
                             text=True, env=env, cwd=ROOT, timeout=180)
        assert run.returncode == 0, run.stdout + run.stderr
    finally:
        procs.stop_all()
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert len(records) == len({r["id"] for r in records}) == 40
    assert {r["verdict"] for r in records} == {"pass"}
    assert all(r["env"]["simulated"] and r["reason"] == "simulated" for r in records)
    assert {len(r["env"]["lease"]) for r in records} == {1, 2}  # tp=2 leases two devices
    assert {d for r in records for d in r["env"]["lease"]} <= {str(i) for i in range(8)}
    assert all(r["timing"]["fwd"]["median_ms"] > 0 for r in records)
    assert lease_overlaps(records) == 0
