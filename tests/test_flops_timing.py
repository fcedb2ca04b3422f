"""FLOP model (exact visible pairs) and the adaptive timer."""

import itertools

import pytest
import torch

from attnbench.flops import BACKWARD_FACTOR, case_flops, gpu_kind, peak_tflops, visible_pairs
from attnbench.problem import AttnSpec
from attnbench.spec import TimingOptions, make_case
from attnbench.timing import _CpuClock, measure, summarize


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


def test_gpu_kinds_and_peaks():
    assert gpu_kind("NVIDIA H100 80GB HBM3") == "H100"
    assert gpu_kind("NVIDIA H200") == "H200"
    assert gpu_kind("NVIDIA A100-SXM4-80GB") == "A100"
    assert gpu_kind("cpu") == "cpu"
    assert peak_tflops("NVIDIA H100 PCIe", "bf16") == 756.0
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.4
    assert peak_tflops("cpu", "bf16") is None


def test_summary_quartiles():
    stats = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (stats.min_ms, stats.q1_ms, stats.median_ms, stats.q3_ms) == (1.0, 2.0, 3.0, 4.0)
    assert stats.samples_ms == [5.0, 1.0, 3.0, 2.0, 4.0]  # raw order kept


class _FakeClock:
    name = "fake"

    def __init__(self, values):
        self.values = iter(values)

    def sample(self, fn):
        fn()
        return next(self.values)


def test_measure_stops_when_spread_is_small_and_respects_caps():
    calls = []
    steady = measure(lambda: calls.append(1), _FakeClock([1.0] * 100),
                     TimingOptions(warmup=2, min_samples=5, max_samples=50, target_rel_iqr=0.05))
    assert steady.n == 5 and len(calls) == 7  # 2 warm-up + 5 samples
    noisy = measure(lambda: None, _FakeClock(itertools.cycle([1.0, 2.0, 3.0])),
                    TimingOptions(warmup=0, min_samples=3, max_samples=12, max_seconds=60))
    assert noisy.n == 12  # never settles: stops at max_samples
    real = measure(lambda: sum(range(1000)), _CpuClock(), TimingOptions(max_seconds=0.05))
    assert real.median_ms > 0 and real.n >= 5
