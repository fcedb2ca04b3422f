"""A backend's compile is kept out of its case's timeout (issue 27: a cold FlexAttention compile
took 87.5 s and counted against ``timeout_s``): inside ``attnbench.backends.base.compiling()`` the
rank tells its pool, which stops the call's clock, up to the compile's own limit. Real rank
processes, no torch; about 10 s."""

from __future__ import annotations

import pytest

from attnbench.execution import call_clock
from attnbench.execution.pool import RankPool

FN = "attnbench.execution.testing:compile_then_work"


@pytest.fixture
def pool():
    p = RankPool()
    yield p
    p.close()


def test_a_compile_longer_than_the_timeout_does_not_time_the_case_out(pool):
    outcome = pool.run(FN, {"compile_s": 2.0, "work_s": 0.2}, timeout=1.0)
    assert outcome.kind == "ok" and outcome.result == "done", outcome
    assert outcome.wall_s > 2.0  # margin: the call ran 2.2 s under a 1 s timeout


def test_work_after_the_compile_still_counts(pool):
    outcome = pool.run(FN, {"compile_s": 0.5, "work_s": 3.0}, timeout=1.5)
    assert outcome.kind == "timeout", outcome
    assert "of compiling were not counted against the timeout" in outcome.note, outcome.note


def test_a_compile_that_never_ends_still_times_out(pool, monkeypatch):
    monkeypatch.setattr(call_clock, "COMPILE_GRACE_S", 1.0)
    outcome = pool.run(FN, {"compile_s": 30.0}, timeout=60.0)
    assert outcome.kind == "timeout" and outcome.summary.startswith("still compiling after 1 s")
    assert outcome.wall_s < 15.0, outcome  # not the 30 s sleep, nor the 60 s timeout


def test_the_caller_hears_when_the_compile_starts_and_ends(pool):
    """What the worker passes on to the client's progress line ("compiling <case>")."""
    heard = []
    outcome = pool.run(FN, {"compile_s": 0.3, "work_s": 0.1}, timeout=10.0,
                       on_compile=heard.append)
    assert outcome.kind == "ok" and heard == [True, False]
    # A listener that raises never stops the case.
    outcome = pool.run(FN, {"compile_s": 0.1}, timeout=10.0, on_compile=lambda start: 1 / 0)
    assert outcome.kind == "ok", outcome
