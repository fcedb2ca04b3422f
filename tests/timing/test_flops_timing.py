"""FLOP and byte model (exact visible pairs, exact backward), and the timer: where the window,
the L2 flush, the warm-up and the syncs are, adaptive stop, noisy flag, several ranks."""

import itertools
import threading

import pytest
import torch

from attnbench.problem.attn_spec import AttnSpec
from attnbench.sweep.case import make_case
from attnbench.sweep.flops import BACKWARD_FACTOR, case_bytes, case_flops, visible_pairs
from attnbench.sweep.options import TimingOptions
from attnbench.timing.loop import (CpuClock, EventClock, StopRule, calls_per_sample, measure,
                                   summarize)


@pytest.mark.parametrize("sq, sk, left, right", list(itertools.product(
    [1, 7, 32], [1, 9, 32], [-1, 0, 3], [-1, 0, 2])))
def test_visible_pairs_match_the_mask(sq, sk, left, right):
    spec = AttnSpec(scale=1.0, window_left=left, window_right=right, seqlen_q_total=sq,
                    seqlen_kv_total=sk)
    mask = spec.visible(torch.arange(sq), torch.arange(sk))
    expected = sq * sk if mask is None else int(mask.sum())
    assert visible_pairs(sq, sk, left, right) == expected


def test_case_flops_causal_gqa_and_backward_factor():
    full = make_case("t", dict(backend="naive", batch=2, seqlen_q=128, heads_q=8, heads_kv=2,
                               head_dim=64))
    causal = full.replace(mask="causal")
    fwd, bwd = case_flops(full)
    assert fwd == 2 * 2 * 8 * 128 * 128 * (64 + 64)  # GQA does not change FLOPs
    assert bwd == BACKWARD_FACTOR * fwd
    assert case_flops(causal)[0] == fwd * (128 * 129 / 2) / (128 * 128)


def test_backward_flops_are_exact_when_head_dims_differ():
    """Backward = recompute QK^T (D) + dV (Dv) + dP (Dv) + dQ (D) + dK (D) per visible pair."""
    case = make_case("t", dict(backend="naive", seqlen_q=16, head_dim=128, head_dim_v=64,
                               heads_q=2))
    fwd, bwd = case_flops(case)
    pairs = 2 * 1 * 2 * 16 * 16
    assert fwd == pairs * (128 + 64)
    assert bwd == pairs * (3 * 128 + 2 * 64)
    assert bwd / fwd != BACKWARD_FACTOR  # 2.67, not 2.5


def test_minimal_traffic_counts_each_tensor_once():
    case = make_case("t", dict(backend="naive", seqlen_q=8, seqlen_kv=16, heads_q=4, heads_kv=1,
                               head_dim=32, dtype="bf16"))
    fwd, bwd = case_bytes(case)
    q, k, v, o = 4 * 8 * 32, 16 * 32, 16 * 32, 4 * 8 * 32
    lse = 4 * 8 * 4
    assert fwd == (q + k + v + o) * 2 + lse
    assert bwd == (2 * (q + k + v) + 2 * o) * 2 + lse


def test_summary_quartiles():
    stats = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (stats.min_ms, stats.q1_ms, stats.median_ms, stats.q3_ms) == (1.0, 2.0, 3.0, 4.0)
    assert stats.samples_ms == [5.0, 1.0, 3.0, 2.0, 4.0]  # raw order kept


# -- the event clock, without a GPU: a fake event API records the order of calls --------------


class FakeDevice:
    """Events and an L2 flush that log what happens, with a GPU time per kernel call."""

    def __init__(self, call_ms=(1.0,)):
        self.log: list[str] = []
        self.gpu_ms = 0.0
        self.call_ms = itertools.cycle(call_ms)

    def new_event(self):
        device = self

        class Event:
            def record(self):
                device.log.append("record")
                self.at = device.gpu_ms

            def synchronize(self):
                device.log.append("sync")

            def elapsed_time(self, other):
                return other.at - self.at

        return Event()

    def flush(self):
        self.log.append("flush")

    def kernel(self):
        self.log.append("call")
        self.gpu_ms += next(self.call_ms)


def _windows(log):
    """The stretches between a start record and its end record."""
    out, inside = [], None
    for entry in log:
        if entry == "record":
            if inside is None:
                inside = []
            else:
                out.append(inside)
                inside = None
        elif inside is not None:
            inside.append(entry)
    return out


def test_event_window_holds_only_the_calls_and_the_flush_comes_before_it():
    dev = FakeDevice()
    clock = EventClock(dev.new_event, dev.flush)
    assert clock.sample(dev.kernel, calls=3) == 1.0
    assert dev.log == ["flush", "record", "call", "record"] * 3 + ["sync"]
    stats = measure(dev.kernel, clock, TimingOptions(warmup=2, warmup_ms=0, min_samples=4,
                                                     max_samples=4, min_sample_ms=0))
    assert stats.n == 4
    for window in _windows(dev.log):
        assert window == ["call"]  # no sync, no flush inside any window
    # every sample (warm-up ones too) is flushed just before its start event
    for i, entry in enumerate(dev.log):
        if entry == "flush":
            assert dev.log[i + 1] == "record"


def test_warm_up_runs_until_both_count_and_time_are_reached():
    dev = FakeDevice(call_ms=(2.0,))
    clock = EventClock(dev.new_event, dev.flush)
    stats = measure(dev.kernel, clock, TimingOptions(warmup=3, warmup_ms=25.0, min_samples=3,
                                                     max_samples=3, min_sample_ms=0))
    assert stats.warmup_calls == 13 and stats.warmup_ms == 26.0  # 13 x 2 ms >= 25 ms
    assert dev.log.count("call") == 13 + 3
    dev = FakeDevice(call_ms=(50.0,))
    stats = measure(dev.kernel, EventClock(dev.new_event, dev.flush),
                    TimingOptions(warmup=3, warmup_ms=25.0, min_samples=3, max_samples=3))
    assert stats.warmup_calls == 3  # the count decides for a long kernel


def test_short_kernels_get_several_calls_per_sample():
    assert calls_per_sample(0.03, 0.1) == 4
    assert calls_per_sample(2.0, 0.1) == 1
    assert calls_per_sample(None, 0.1) == 1
    dev = FakeDevice(call_ms=(0.02,))
    stats = measure(dev.kernel, EventClock(dev.new_event, dev.flush),
                    TimingOptions(warmup=2, warmup_ms=0, min_samples=3, max_samples=3,
                                  min_sample_ms=0.1))
    assert stats.calls_per_sample == 5
    assert stats.median_ms == pytest.approx(0.02)  # per call, not per sample
    assert dev.log.count("call") == 2 + 3 * 5
    assert all(w == ["call"] for w in _windows(dev.log))  # each call its own cold window


def test_stop_rule_and_noisy_flag():
    steady = measure(lambda: None, _Values([1.0] * 100),
                     TimingOptions(warmup=2, warmup_ms=0, min_samples=5, max_samples=50))
    assert steady.n == 5 and not steady.noisy
    noisy = measure(lambda: None, _Values(itertools.cycle([1.0, 2.0, 3.0])),
                    TimingOptions(warmup=0, warmup_ms=0, min_samples=3, max_samples=12,
                                  max_seconds=60))
    assert noisy.n == 12 and noisy.noisy  # never settles: stops at max_samples, flagged
    rule = StopRule(TimingOptions(min_samples=3, max_samples=10, max_seconds=1.0))
    assert not rule.should_stop([1.0, 5.0], elapsed_s=2.5)      # under min_samples: a floor
    assert rule.should_stop([1.0, 5.0], elapsed_s=10.5)         # a very slow call (FLOOR_CAP)
    assert rule.should_stop([1.0, 5.0, 9.0], elapsed_s=1.1)     # min_samples and the cap
    real = measure(lambda: sum(range(1000)), CpuClock(), TimingOptions(max_seconds=0.05,
                                                                        warmup_ms=0))
    assert real.median_ms > 0 and real.n >= 5


class _Values:
    """A clock returning given per-call times."""

    name = "fake"

    def __init__(self, values):
        self.values = iter(values)

    def sample(self, fn, calls=1):
        for _ in range(calls):
            fn()
        return next(self.values)


class _ThreadRanks:
    """The Coordinator of one of ``n`` ranks simulated by threads (what Comm does over gloo)."""

    def __init__(self, shared, rank):
        self.shared, self.rank = shared, rank

    def _exchange(self, value, combine):
        s = self.shared
        s["values"][self.rank] = value
        s["barrier"].wait()
        result = combine(s["values"])
        s["barrier"].wait()
        return result

    def align(self):
        self.shared["barrier"].wait()

    def slowest(self, ms):
        return self._exchange(ms, max)

    def decide(self, value):
        return self._exchange(value, lambda values: values[0])


def test_ranks_agree_on_every_decision_and_take_the_slowest_sample():
    """Rank 1 is twice as slow and noisy; both ranks make the same calls and report the same
    samples: the slowest rank's."""
    shared = {"barrier": threading.Barrier(2), "values": [None, None]}
    options = TimingOptions(warmup=2, warmup_ms=5.0, min_samples=4, max_samples=30,
                            target_rel_iqr=0.05, min_sample_ms=3.0)
    times = {0: itertools.cycle([1.0]), 1: itertools.cycle([2.0, 2.1, 1.9, 2.0])}
    results, calls = {}, {0: 0, 1: 0}

    def rank(r):
        def fn():
            calls[r] += 1

        class Clock:
            name = "fake"

            def sample(self, f, n=1):
                for _ in range(n):
                    f()
                return next(times[r])

        results[r] = measure(fn, Clock(), options, _ThreadRanks(shared, r))

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert results[0] == results[1]
    assert calls[0] == calls[1]
    assert min(results[0].samples_ms) >= 1.9  # rank 1's times, not rank 0's 1.0
    assert results[0].calls_per_sample == 2  # from the slowest warm-up time (1.9 ms) and 3 ms
