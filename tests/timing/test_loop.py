"""The loop's floor and blocks (issue 40): ``min_samples`` holds past ``max_seconds``; a CPU
sample is a block of calls lasting ``cpu_min_sample_ms``, sized from the fastest of the last
warm-up calls; the record says how many calls a sample held."""

import itertools
import types

import pytest
import torch

from attnbench.sweep.case import make_case
from attnbench.sweep.options import FLOOR_CAP, FLOOR_WALL_CAP, TimingOptions
from attnbench.timing import loop
from attnbench.timing.case import time_case
from attnbench.timing.loop import (CpuClock, EventClock, ProcessClock, StopRule, calls_per_sample,
                                   measure, sample_target_ms)

GATE = dict(warmup=3, warmup_ms=0, min_samples=20, max_samples=60, max_seconds=0.5)
"""docs/compare.md's gate options (its cpu_clock aside: the clocks here are fakes)."""


class SlowWall:
    """A CPU clock on a loaded box: each call takes ``cpu_ms`` of work (the sample) and
    ``wall_s`` of the loop's wall clock (waiting for a core), which it advances."""

    name, cpu = "fake_cpu", True

    def __init__(self, cpu_ms, wall_s):
        self.times, self.wall_s, self.now = itertools.cycle(cpu_ms), wall_s, 0.0
        self.calls = []

    def sample(self, fn, calls=1):
        self.calls.append(calls)
        self.now += self.wall_s * calls
        return sum(next(self.times) for _ in range(calls)) / calls


@pytest.fixture
def fake_wall(monkeypatch):
    """The loop's ``time.perf_counter`` read from the clock's own wall time."""
    def install(clock):
        monkeypatch.setattr(loop, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
        return clock
    return install


def test_min_samples_is_a_floor_past_max_seconds():
    rule = StopRule(TimingOptions(**GATE))
    unsettled = [1.0, 2.0, 3.0] * 7
    assert not rule.should_stop(unsettled[:19], elapsed_s=1.5)  # old code: stopped at 2x 0.5 s
    assert not rule.should_stop(unsettled[:19], elapsed_s=FLOOR_CAP * 0.5 - 0.01)
    assert rule.should_stop(unsettled[:19], elapsed_s=FLOOR_CAP * 0.5)  # a call of seconds
    # the calls' own time decides, not the wall clock a loaded box stretches ...
    assert not rule.should_stop(unsettled[:19], elapsed_s=FLOOR_CAP * 0.5, measured_s=0.1)
    assert rule.should_stop(unsettled[:19], elapsed_s=1.0, measured_s=FLOOR_CAP * 0.5)
    # ... up to a wall cap
    assert rule.should_stop(unsettled[:19], elapsed_s=FLOOR_WALL_CAP * 0.5, measured_s=0.1)
    assert not rule.should_stop(unsettled[:20], elapsed_s=0.4)  # past the floor, unsettled
    assert rule.should_stop(unsettled[:20], elapsed_s=0.5)      # ... until max_seconds
    assert rule.should_stop([1.0] * 20, elapsed_s=0.0)          # ... or settled
    assert StopRule(TimingOptions(min_samples=5, max_samples=5)).should_stop([1.0] * 5, 0.0)


@pytest.mark.parametrize("cpu_ms, wall_s, n", [
    ([1.0, 1.5], 0.1, 20),     # max_seconds (0.5 s) out after 5; the old rule stopped at 10
    ([1.0, 1.5], 1.0, 20),     # wall 1000x the work (a 20 ms forward took 0.4 s at load 8)
    ([1.0, 1.5], 2.0, FLOOR_WALL_CAP * 0.5 / 2.0),  # the wall cap: 30 s of 2 s samples
    ([600.0], 0.6, 9),         # calls of 0.6 s: the floor's cap, 5 s of them, after 9
])
def test_a_loaded_box_still_gets_min_samples(fake_wall, cpu_ms, wall_s, n):
    """Each sample takes ``wall_s`` of wall time: the floor holds (margin: 2x the old rule's
    10 samples) until the calls' own time reaches FLOOR_CAP x max_seconds, or the wall clock
    FLOOR_WALL_CAP x max_seconds."""
    clock = fake_wall(SlowWall(cpu_ms, wall_s=wall_s))
    stats = measure(lambda: None, clock, TimingOptions(**GATE, cpu_min_sample_ms=0))
    assert stats.n == n


def test_cpu_samples_are_blocks_sized_from_the_fastest_of_the_last_warm_up_calls(fake_wall):
    # warm-up 4.0 (compiles), then 0.3, a preempted 3.0, 0.3: blocks from 0.3 ms, not 3.0
    clock = fake_wall(SlowWall([4.0, 0.3, 3.0] + [0.3] * 200, wall_s=1e-4))
    stats = measure(lambda: None, clock, TimingOptions(**{**GATE, "warmup": 4}))
    assert stats.calls_per_sample == 7 == calls_per_sample(0.3, 2.0)  # ceil(2 / 0.3)
    assert set(clock.calls[4:]) == {7} and clock.calls[:4] == [1] * 4
    assert stats.median_ms == pytest.approx(0.3)  # per call, not per block


def test_the_sample_target_is_the_cpus_on_a_cpu_and_min_sample_ms_on_events():
    options = TimingOptions(min_sample_ms=0.1, cpu_min_sample_ms=2.0)
    assert sample_target_ms(CpuClock(), options) == 2.0
    assert sample_target_ms(ProcessClock(), options) == 2.0
    assert sample_target_ms(EventClock(lambda: None, lambda: None), options) == 0.1
    assert calls_per_sample(0.3, 0.0) == 1  # 0: one call a sample, as documented
    assert calls_per_sample(1e-6, 2.0) == loop.MAX_CALLS_PER_SAMPLE


def test_the_record_says_how_many_calls_a_sample_held():
    case = make_case("t", dict(backend="naive", seqlen_q=16, heads_q=1, head_dim=16))
    x = torch.ones(64)
    timing = time_case(case, torch.device("cpu"), lambda: x.add(1), None,
                       TimingOptions(warmup=3, warmup_ms=0, min_samples=3, max_samples=5,
                                     max_seconds=0.05))
    assert timing["fwd"]["calls_per_sample"] > 1  # a call of microseconds: a block of them
    assert timing["fwd"]["n"] >= 3
