"""Never silent (issue 40, item 4): the progress line comes at once and again while no record
arrives (a FlexAttention sweep printed nothing for 134 s), says what runs the longest, and a
worker's news that a case compiles becomes one line. Scripted cluster, in process."""

from __future__ import annotations

import io

from attnbench.dispatch import loop
from attnbench.dispatch.loop import Progress
from attnbench.dispatch.run import SweepRun
from cluster_rig import FakeConnection, scripted_store, worker_infos


def _flying(tmp_path):
    """A run whose two cases are out on the cluster, never finishing."""
    store = scripted_store(tmp_path, ["any"], seeds=2)
    stream = io.StringIO()
    run = SweepRun(store, FakeConnection(lambda d, fut: None, [worker_infos(("A", 1))]),
                   Progress(0, len(store.done), stream))
    run.plan()
    run.start()
    assert len(run.in_flight) == 2
    return run, stream


def test_the_line_comes_before_any_record_and_again_while_none_arrives(tmp_path, monkeypatch):
    run, stream = _flying(tmp_path)
    run.progress.heartbeat(run.running_text())
    first = stream.getvalue().splitlines()
    assert len(first) == 1 and first[0].startswith("[0/2] 0s elapsed, ETA ?; 2 running, the "
                                                   "longest ")
    run.progress.heartbeat(run.running_text())
    assert len(stream.getvalue().splitlines()) == 1  # not more than every HEARTBEAT_S
    monkeypatch.setattr(loop, "HEARTBEAT_S", 0.0)
    run.progress.heartbeat(run.running_text())
    assert len(stream.getvalue().splitlines()) == 2
    run.store.close()


def test_a_compile_the_worker_reports_is_said_once_and_foreign_news_is_ignored(tmp_path):
    run, stream = _flying(tmp_path)
    case = next(iter(run.in_flight.values())).case
    for event in [(1.0, {"case": case.id, "start": True}), (1.0, {"case": case.id, "start": True}),
                  (1.0, {"case": "f" * 64, "start": True}),  # not a case of this run
                  (1.0, "junk"), "junk", (1.0, {"case": ["x"], "start": True})]:
        run.compile_news.put(event)
    run.read_compile_news()
    lines = stream.getvalue().splitlines()
    assert lines == [f"attnbench: compiling {case.id[:10]} {case.label} (naive: its first call "
                     "compiles; the case's timeout waits for it)"]
    run.progress.heartbeat(run.running_text())
    if next(iter(run.in_flight.values())).case.id == case.id:  # the longest is the one compiling
        assert "compiling for 0 s" in stream.getvalue().splitlines()[-1]
    run.store.close()
