"""The shipped capture example (issue 42 item 4): the committed capture of a tiny trained
transformer (``python benchmarks/capture_example.py --out tests/support/data`` wrote it) has the
structure Gaussian inputs lack, and ``mutant.k_int8_unsmoothed`` -- K quantized to int8 without
the mean key subtracted -- passes the synthetic normal input at its shape and fails on it.

Measured (bf16, causal, 1 x 4 heads x 128 x 16, judged against naive by its declaration): the
mutant's worst error / bound is 0.73 and 0.75 on normal inputs (seeds 0, 1), 1.82 (dK) on call 0
and 17.5 (dV, against the fused baseline: naive itself is over its absolute bound there) on
call 1; naive on call 0: 0.20.
"""

from __future__ import annotations

import torch

from attnbench.capture import load_capture
from attnbench.execution.case_runner import run_case
from attnbench.sweep.case import make_case
from attnbench.sweep.options import RunOptions, TimingOptions
from helpers import ROOT

CAPTURE = ROOT / "tests" / "support" / "data" / "captured_example.safetensors"
NO_TIMING = RunOptions(timeout_s=120, timing=TimingOptions(enabled=False))
SHAPE = dict(batch=1, seqlen_q=128, heads_q=4, head_dim=16, mask="causal", dtype="bf16")
MUTANT = "mutant.k_int8_unsmoothed"


def worst(record: dict) -> float:
    """The largest value / bound of any check (determinism's bound is 0: left out)."""
    return max(c["value"] / c["bound"] for c in record["checks"] if c["bound"])


def run(backend: str, seed: int = 0, **fields) -> dict:
    return run_case(make_case("test", dict(backend=backend, seed=seed, **fields)), NO_TIMING)


def key_correlation(k: torch.Tensor) -> float:
    """Mean cosine between distinct key rows; k (batch, heads, seq, head_dim)."""
    unit = torch.nn.functional.normalize(k.double(), dim=-1)
    n = k.shape[-2]
    return float(((unit @ unit.transpose(-1, -2)).sum((-1, -2)) - n).mean() / (n * (n - 1)))


def test_the_committed_capture_is_small_and_its_keys_have_structure():
    assert CAPTURE.stat().st_size < 200 << 10
    calls = load_capture(CAPTURE)
    assert [c.meta["layer"] for c in calls] == ["blocks.0.attn", "blocks.1.attn"]
    k = calls[0].tensors["k"]
    assert k.shape == (1, 4, 128, 16) and k.dtype == torch.bfloat16 and "dout" in calls[0].tensors
    # trained keys share a direction (0.12, measured); Gaussian ones do not (|cos| ~ 0.002)
    assert key_correlation(k) > 0.08 > 10 * abs(key_correlation(torch.randn(k.shape)))


def test_the_unsmoothed_int8_mutant_passes_normal_inputs_and_fails_the_captured_call():
    for seed in (0, 1):  # 0.73, 0.75: a pass with a quarter of the bound to spare
        normal = run(MUTANT, seed, inputs="normal", **SHAPE)
        assert normal["verdict"] == "pass" and worst(normal) < 0.85, normal["reason"]
    captured = run(MUTANT, inputs="captured", captured=f"{CAPTURE}:0")
    assert captured["verdict"] == "fail" and worst(captured) > 1.5, captured["reason"]  # 1.82
    control = run("naive", inputs="captured", captured=f"{CAPTURE}:0")  # the code it edits
    assert control["verdict"] == "pass" and worst(control) < 0.3, control["reason"]  # 0.20

