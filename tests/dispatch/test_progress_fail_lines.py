"""The failing cases a run prints as they arrive (issue 39 item 7): the first SHOWN_LIVE get a
line each, the rest a count when the loop ends, and the run's summary learns which were shown
(it lists others, not them again). A broken kernel printed 73 FAIL lines before."""

import io
import time

from attnbench.dispatch import loop
from attnbench.dispatch.loop import SHOWN_LIVE, Progress
from attnbench.dispatch.run import SweepRun
from attnbench.results.records import make_record
from attnbench.results.store import RunStore
from attnbench.sweep.load import parse_sweep

SWEEP = """name: failing
defaults: {batch: 1, seqlen_q: 32, heads_q: 2, head_dim: 16, dtype: fp32}
axes: {backend: [naive], seed: {range: [0, 30]}}
"""


class _NoWorkers:
    def workers(self):
        return []


def _records(verdicts):
    sweep = parse_sweep(SWEEP, "failing.yaml")
    return sweep, [make_record(case, verdict=v, reason=f"on purpose {i}")
                   for i, (case, v) in enumerate(zip(sweep.cases, verdicts))]


def test_the_first_failures_get_a_line_and_the_rest_a_count():
    verdicts = ["pass", "fail"] + ["fail", "crash", "pass"] * 9 + ["timeout"]
    _, records = _records(verdicts)
    stream = io.StringIO()
    progress = Progress(len(records), 0, stream)
    for r in records:
        progress.update(r)
    progress.finish()
    lines = stream.getvalue().splitlines()
    bad = [r for r in records if r["verdict"] != "pass"]
    shown = [line for line in lines if line.startswith("  ") and "on purpose" in line]
    assert SHOWN_LIVE == 10 and len(shown) == SHOWN_LIVE
    assert progress.shown == {r["id"] for r in bad[:SHOWN_LIVE]}
    assert shown[0].startswith("  FAIL     ") and "CRASH" in shown[2]
    more = len(bad) - SHOWN_LIVE
    assert lines[-1] == (f"  ... and {more} more failures (the summary lists more and what "
                         "they share)")
    # the progress line still counts them all
    assert any(line.startswith(f"[{len(records)}/{len(records)}] crash 9 fail 10 pass 10 "
                               "timeout 1") for line in lines)


def test_few_failures_get_no_count_and_a_quiet_run_prints_none():
    _, records = _records(["fail", "pass", "error"])
    stream = io.StringIO()
    progress = Progress(3, 0, stream)
    for r in records:
        progress.update(r)
    progress.finish()
    assert "more failure" not in stream.getvalue() and len(progress.shown) == 2
    quiet = Progress(3, 0, io.StringIO(), quiet=True)
    for r in records:
        quiet.update(r)
    quiet.finish()
    assert quiet.stream.getvalue().count("on purpose") == 0 and quiet.shown == set()


def test_the_run_summary_carries_the_ids_shown(tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "SHOWN_LIVE", 3)
    sweep, records = _records(["fail"] * 5 + ["pass"])
    store = RunStore(tmp_path / "run", sweep, command=["test"])
    stream = io.StringIO()
    run = SweepRun(store, _NoWorkers(), Progress(0, 0, stream))
    for r in records:
        run.write(r)
    summary = run.finish(time.perf_counter())
    store.close()
    assert summary.shown == frozenset(r["id"] for r in records[:3])
    assert stream.getvalue().count("on purpose") == 3
    assert "  ... and 2 more failures" in stream.getvalue()
