"""Lanes (attnbench/dispatch/lanes.py): devices pull their next case from the driver. The
bookkeeping that keeps the journal exact, then real processes: simulated workers, one SIGKILLed
mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from attnbench.cluster.simulation import lease_overlaps
from attnbench.dispatch.lane_server import LaneConn
from attnbench.dispatch.lanes import LaneRun, _Lane
from attnbench.dispatch.loop import Progress
from attnbench.results.records import make_record
from attnbench.sweep.case import Case
from cluster_rig import (FakeConnection, Processes, journal_of, scripted_store, wait_for,
                        worker_infos)
from helpers import ROOT, attnbench_cmd


def _lane_run(tmp_path, seeds: int) -> LaneRun:
    store = scripted_store(tmp_path, ["A"], seeds=seeds)
    run = LaneRun(store, FakeConnection(None, [worker_infos(("A", 2))]),
                  Progress(0, 0, open(os.devnull, "w")))
    run.plan()
    run._queue_todo()
    group = next(iter(run.queues))
    run.lanes = {"L1": _Lane("L1", group, "w1", 1), "L2": _Lane("L2", group, "w2", 1)}
    return run


def _conn(run: LaneRun, lane: str) -> LaneConn:
    """A connection that proved to be ``lane`` (the handshake is tested in
    test_hostile_lanes.py); a lane connects once, so the bookkeeping tests reopen it."""
    run.lanes[lane].connected = False
    conn = LaneConn(peer="test")
    run.lane_connected(conn, lane)
    return conn


def _done(answer: dict, verdict: str = "pass") -> dict:
    record = make_record(Case.from_dict(answer["case"]), verdict=verdict, reason="ok")
    return {"lease": answer["lease"], "record": json.dumps(record)}


def test_a_case_whose_lanes_die_goes_back_then_is_lost_and_nothing_is_written_twice(tmp_path):
    run = _lane_run(tmp_path, seeds=3)
    first = run.queues[next(iter(run.queues))][0]
    for death in range(run.allowed_failures):  # the lane holding `first` dies each time
        conn = _conn(run, "L1")
        run.lanes["L1"].worker = f"w{death}"  # once per worker: Dask's count
        answer = run.lane_request(conn, None)
        assert answer["case"]["seed"] == first.seed  # it went back to the front of the queue
        assert answer["id"] == first.id and "L1" in run.in_flight
        run.lane_closed(conn)
        assert "L1" not in run.in_flight
        if death == 0:  # another lane of the same dying worker: not a second death
            again = _conn(run, "L1")
            run.lane_request(again, None)
            run.lane_closed(again)
            assert run.deaths[first.id] == {"w0"}
    # Another lane runs the rest; it hands in each record with its next request.
    conn, done = _conn(run, "L2"), None
    while (answer := run.lane_request(conn, done))["case"] is not None:
        done = _done(answer)
    run.lane_closed(conn)  # closed after its empty answer: holds nothing, changes nothing
    while not run.done.empty():
        run.step(0)
    run.store.close()
    lines = journal_of(tmp_path / "run")
    assert sorted(r["verdict"] for r in lines) == ["lost", "pass", "pass"]
    lost = next(r for r in lines if r["verdict"] == "lost")
    assert lost["id"] == first.id and lost["reason"].startswith("KilledWorker: 3 workers died")
    assert len({r["id"] for r in lines}) == 3 and not run.in_flight and not run.queued()


def test_a_stopping_run_leaves_what_lanes_hold_pending(tmp_path):
    run = _lane_run(tmp_path, seeds=2)
    conn = _conn(run, "L1")
    run.lane_request(conn, None)
    run.stopping = True
    run.lane_closed(conn)  # the driver closed the connection: not a death, nothing re-queued
    assert run.queued() == 1 and not run.deaths and run.done.empty()
    assert run.lane_request(_conn(run, "L2"), None) == {"case": None}
    run.store.close()


def test_lanes_survive_a_worker_sigkilled_mid_run(tmp_path):
    """Two simulated workers of one kind; one is SIGKILLed while its lanes hold cases: every
    case is recorded once, none lost, no device leased twice at once."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    sweep = tmp_path / "sim.yaml"
    sweep.write_text(json.dumps({"name": "sim", "defaults": {"backend": "naive", "gpu": "SIM-X",
                                                             "heads_q": 8},
                                 "axes": {"tp": [1, 2], "seed": list(range(40))}}))
    procs = Processes(tmp_path, env)
    out = tmp_path / "run"
    try:
        address = procs.scheduler("scheduler")
        workers = {}
        for name in ("sim-a", "sim-b"):
            workers[name] = procs.start(name, [
                *attnbench_cmd(), "worker", "--scheduler", address, "--name", name, "--kind",
                "SIM-X", "--simulate-gpus", "4", "--case-seconds", "0.2", "--no-nanny",
                "--no-dashboard"])
        for name in workers:
            wait_for(lambda: "Registered to" in (tmp_path / f"{name}.log").read_text(), 90,
                      name)
        run = subprocess.Popen([*attnbench_cmd(), "run", str(sweep), "--out", str(out),
                                "--scheduler", address, "--workers", "2", "--no-report",
                                "--dispatch", "lanes"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
        journal = out / "records.jsonl"
        wait_for(lambda: journal.exists() and len(journal.read_text().splitlines()) >= 15,
                  120, "15 records")
        workers["sim-b"].send_signal(signal.SIGKILL)
        killed_at = time.time()
        output, _ = run.communicate(timeout=180)
        assert run.returncode == 0, output
    finally:
        procs.stop_all()
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    assert len(records) == len({r["id"] for r in records}) == 80
    assert {r["verdict"] for r in records} == {"pass"}
    assert lease_overlaps(records) == 0
    assert any(r["env"]["worker"] == "sim-b" for r in records)
    assert any(r["env"]["worker"] == "sim-a" and r["env"]["lease_start"] > killed_at
               for r in records)


def test_lanes_are_planned_only_when_room_may_have_grown(tmp_path):
    """Planning walks every lane and worker; after every batch of records that was the driver's
    largest cost at 288 GPUs (0.5 ms a record). It runs again only after what can free a device
    or queue a case again: a connection closed, a lane ended, a tick's look at the workers."""
    run = _lane_run(tmp_path, seeds=3)
    plans = []
    run._hand_keys = lambda address, keys: plans.append(keys) and False  # plan, start nothing
    run.hand_out()
    assert plans and not run.room_may_grow
    planned = len(plans)
    for _ in range(3):  # records came in, nothing else changed
        run.hand_out()
    assert len(plans) == planned
    conn = _conn(run, "L1")
    run.lane_request(conn, None)
    run.lane_closed(conn)  # its worker died: the case is queued again
    run.hand_out()
    assert len(plans) == 2 * planned

    class Ended:
        key, status = "L2", "finished"
    run._lane_ended(Ended())  # a device is free again
    run.hand_out()
    assert len(plans) == 3 * planned
    run.store.close()
