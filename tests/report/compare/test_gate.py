"""The speed gate on a noisy box, without one (issue 40): timings drawn, seeded, from one noisy
distribution of sub-millisecond calls, through the real loop (:func:`attnbench.timing.loop.
measure` under docs/compare.md's gate options) and the real rule (:func:`classify` at 25 %):
an unchanged rerun is never SLOW, a 3x slowdown always is. And the rule's fence for timings of
too few samples. ``benchmarks/speed_gate.py`` measures the same on real calls."""

import math
import random
import types

import pytest

from attnbench.report.compare.gate import FENCE, bound, classify, few_samples
from attnbench.report.read.doubt import FEW_SAMPLES
from attnbench.sweep.options import TimingOptions
from attnbench.timing import loop
from attnbench.timing.loop import measure

GATE = TimingOptions(warmup=3, warmup_ms=0, min_samples=20, max_samples=60, max_seconds=0.5,
                     cpu_clock="cpu")
THRESHOLD = 0.25
PAIRS = 150


class NoisyBox:
    """A CPU clock whose calls take ``base_ms`` times lognormal noise (sigma 0.25), 15 % of
    them preempted (1 + an exponential of mean 0.5 times longer): one call a sample spreads
    36 % (median IQR / median), blocks 15 %, as benchmarks/speed_gate.py measured real sdpa
    calls at load 12 on 2 cores (38 % and 12 %). Wall time runs 4.5x the CPU time."""

    name, cpu = "noisy_box", True

    def __init__(self, rng: random.Random, base_ms: float):
        self.rng, self.base_ms, self.now = rng, base_ms, 0.0

    def call_ms(self) -> float:
        ms = self.base_ms * math.exp(self.rng.gauss(0.0, 0.25))
        return ms * (1 + self.rng.expovariate(2.0)) if self.rng.random() < 0.15 else ms

    def sample(self, fn, calls=1):
        total = sum(self.call_ms() for _ in range(calls))
        self.now += 4.5 * total / 1e3
        return total / calls


def _side(stats) -> dict:
    return {"median": stats.median_ms, "min": stats.min_ms, "q1": stats.q1_ms,
            "q3": stats.q3_ms, "n": stats.n, "noisy": stats.noisy}


def test_an_unchanged_rerun_is_never_slow_and_a_3x_slowdown_always_is(monkeypatch):
    """150 seeded pairs of each: 0 false SLOW (the closest: B's best 0.69x A's q3 x 1.25), 150
    of 150 caught (the tightest 1.04x past it). With one call a sample (the loop before issue
    40, ``cpu_min_sample_ms: 0``) the same draws catch 124 of 150: a lucky single call of B
    under A's q3 x 1.25."""
    rng = random.Random(40)
    box = {"clock": None}
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(
        perf_counter=lambda: box["clock"].now))

    def timed(base_ms: float) -> dict:
        box["clock"] = NoisyBox(rng, base_ms)
        return _side(measure(lambda: None, box["clock"], GATE))

    false_slow, caught = [], 0
    for _ in range(PAIRS):
        a, again, slowed = timed(0.3), timed(0.3), timed(0.9)
        if classify(a, again, THRESHOLD) == "SLOW":
            false_slow.append((a, again))
        caught += classify(a, slowed, THRESHOLD) == "SLOW"
        assert a["n"] >= GATE.min_samples
    assert false_slow == []
    assert caught == PAIRS


def test_too_few_samples_must_clear_the_upper_fence():
    """3 samples a side: a q3 is one sample, a minimum of three no quiet moment. B's best
    1.4x A's q3 (a false SLOW by the q3 rule at 25 %) stays under A's fence x 1.25."""
    a = {"median": 1.0, "min": 0.9, "q1": 0.95, "q3": 1.1, "n": 3}
    b = {"median": 1.6, "min": 1.54, "q1": 1.57, "q3": 1.7, "n": 3}
    assert bound(a, few=False) == 1.1 and bound(a, few=True) == pytest.approx(1.1 + FENCE * 0.15)
    assert 1.54 > 1.1 * 1.25 and 1.54 < (1.1 + FENCE * 0.15) * 1.25
    assert classify(a, b, THRESHOLD) == "AMBIGUOUS"
    enough = {**a, "n": FEW_SAMPLES}
    assert classify(enough, {**b, "n": FEW_SAMPLES}, THRESHOLD) == "SLOW"  # the q3 rule
    assert classify(a, {**b, "min": 1.76, "median": 1.8, "q3": 1.9}, THRESHOLD) == "SLOW"
    assert classify(b, a, THRESHOLD) == "AMBIGUOUS"  # FAST is fenced the same way
    assert few_samples(a, {"n": None}) and not few_samples({}, {"n": math.nan})
    assert bound({"q3": 1.1}, few=True) == 1.1  # no q1 (old dicts): the q3
