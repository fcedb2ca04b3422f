"""The client loop against a scripted cluster (no processes): a killed worker's case becomes
``lost`` and nothing is written twice, cases of a kind whose worker left stay pending, and losing
the scheduler is one line with nothing in flight recorded."""

from __future__ import annotations

import os

import pytest

from attnbench.sweep.case import Case
from cluster_rig import (FakeConnection, journal_of, passing_record, scripted_store,
                         worker_infos)


def test_killed_worker_becomes_lost_and_nothing_is_written_twice(tmp_path):
    from types import SimpleNamespace

    from distributed.scheduler import KilledWorker

    from attnbench.results.records import make_record
    from attnbench.dispatch.run import run_pending

    store = scripted_store(tmp_path, ["any"], seeds=3)

    def script(case_dict, fut):
        case = Case.from_dict(case_dict)
        if case.seed == 0:  # its workers died allowed-failures + 1 times
            fut.finish("error", KilledWorker(fut.key, SimpleNamespace(address="tcp://10.0.0.9:1"),
                                             3))
        elif case.seed == 1:  # the journal got this case meanwhile: the result is a duplicate
            store.append(make_record(case, verdict="pass"))
            passing_record(case_dict, fut)
        else:  # a worker with another attnbench computes another id for the same case
            fut.finish("result", make_record(case.replace(seed=7), verdict="pass"))

    summary = run_pending(store, FakeConnection(script, [worker_infos(("A", 1))]),
                          stream=open(os.devnull, "w"))
    lines = journal_of(tmp_path / "run")
    assert [r["verdict"] for r in lines] == ["pass", "lost", "error"]  # "pass": seed 1's own
    assert lines[1]["reason"].startswith("KilledWorker: Attempted to run task 'case-")
    assert "returned a record for case" in lines[2]["reason"]
    assert len({r["id"] for r in lines}) == 3
    assert (summary.written, summary.lost, summary.duplicated) == (2, 1, 1)


def test_cases_of_a_kind_whose_worker_left_stay_pending(tmp_path, monkeypatch):
    from attnbench.dispatch import loop
    from attnbench.dispatch import run as runner

    monkeypatch.setattr(loop, "TICK_S", 0.01)
    held = []
    store = scripted_store(tmp_path, ["A", "B"], seeds=2)
    both, only_b = worker_infos(("A", 1), ("B", 1)), worker_infos(("B", 1))
    # A's futures never finish (their worker died); B's do.
    conn = FakeConnection(
        lambda d, fut: held.append(fut) if d["gpu"] == "A" else passing_record(d, fut),
        [both, both, only_b])
    summary = runner.run_pending(store, conn, stream=open(os.devnull, "w"), worker_wait_s=0.05)
    assert summary.counts == {"pass": 2} and summary.not_run == 2 and summary.lost == 0
    assert {Case.from_dict(d).gpu for d, _ in conn.client.submitted} == {"A", "B"}
    assert all(f.status == "cancelled" for f in held)
    assert {c.gpu for c in store.pending()} == {"A"}  # the next run does them


def test_losing_the_scheduler_raises_one_line_and_records_nothing_in_flight(tmp_path):
    from distributed.client import FutureCancelledError

    from attnbench.errors import ClusterError
    from attnbench.dispatch.run import run_pending

    def script(case_dict, fut):
        if Case.from_dict(case_dict).seed == 0:
            passing_record(case_dict, fut)
        else:
            fut.finish("error", FutureCancelledError(fut.key, "scheduler-connection-lost"))

    store = scripted_store(tmp_path, ["any"], seeds=3)
    with pytest.raises(ClusterError, match=r"lost the connection to the Dask scheduler \(fake "
                                           r"scheduler\); 1 records written by this run"):
        run_pending(store, FakeConnection(script, [worker_infos(("A", 4))]),
                    stream=open(os.devnull, "w"))
    assert [r["verdict"] for r in journal_of(tmp_path / "run")] == ["pass"]
