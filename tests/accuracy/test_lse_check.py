"""Every returned log-sum-exp is judged (attnbench.accuracy.lse_check): the bound, the rows that
see no key (-inf or +inf, never NaN or a number), and that the check is made on dense, packed and
forward-only calls and passes the correct backends there. The CP/TP gathered lse is judged in
tests/accuracy/test_contract.py; the lse mutants are caught in tests/mutants/test_mutants.py."""

from __future__ import annotations

import math

import pytest
import torch

from attnbench.accuracy.lse_check import LSE_ROUNDINGS, lse_bound, lse_checks, scores_dtype
from attnbench.execution.single import run_single_case
from attnbench.sweep.case import make_case
from attnbench.sweep.options import RunOptions, TimingOptions

NO_TIMING = RunOptions(timeout_s=120, timing=TimingOptions(enabled=False))
BASE = dict(seqlen_q=128, heads_q=4, heads_kv=2, head_dim=32)
F32 = torch.float32
INF = math.inf


def test_the_bound_is_roundings_of_the_scores_precision():
    assert lse_bound(F32) == LSE_ROUNDINGS["float32"] * 2.0**-24
    assert lse_bound(torch.bfloat16) == LSE_ROUNDINGS["half"] * 2.0**-8
    assert lse_bound(torch.float16) == LSE_ROUNDINGS["half"] * 2.0**-11
    lse = torch.zeros(3)
    assert scores_dtype(lse.double(), "bf16", False) == F32  # wider than the contract: as fp32
    assert scores_dtype(lse, "bf16", False) == F32           # a fused kernel's fp32 scores
    assert scores_dtype(lse, "bf16", True) == torch.bfloat16  # naive: scores in bf16
    assert scores_dtype(lse, "fp32", True) == F32
    assert scores_dtype(lse.half(), "fp32", False) == torch.float16


def _judge(got, ref, dtype=F32):
    checks, section = lse_checks(torch.tensor(got, dtype=F32), torch.tensor(ref).double(), dtype)
    return [c for c in checks if not c.passed], section


def test_each_row_is_bounded_relative_to_max_1_and_its_size():
    bound = lse_bound(F32)
    ref = [0.25, 10.0, -40.0]
    near = [0.25 + 0.9 * bound, 10 * (1 + 0.9 * bound), -40 * (1 + 0.9 * bound)]
    assert _judge(near, ref)[0] == []
    failed, section = _judge([0.25 + 1.5 * bound, 10.0, -40.0], ref)
    assert [c.check for c in failed] == ["lse"] and failed[0].value == pytest.approx(1.5 * bound)
    assert section["bound"] == bound and section["rows_no_key"] == 0
    failed, _ = _judge([r * math.log2(math.e) for r in ref], ref)  # base 2
    assert failed and failed[0].value > 0.4


def test_rows_that_see_no_key_may_be_either_infinity_never_nan_or_a_number():
    ref = [-INF, 2.0, -INF]
    for empty in (-INF, INF):
        failed, section = _judge([empty, 2.0, empty], ref)
        assert failed == [] and section["no_key_as"] == ("-inf" if empty < 0 else "+inf")
    for wrong in (math.nan, 0.0):
        failed, _ = _judge([wrong, 2.0, -INF], ref)
        assert [c.metric for c in failed] == ["rows that see no key not +-inf"]
    failed, _ = _judge([-INF, math.nan, -INF], ref)  # a row that sees keys: finite
    assert [c.metric for c in failed] == ["non-finite rows that see a key"]


@pytest.mark.parametrize("backend", ["naive", "reference"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("fields", [
    dict(mask="causal", seqlen_q=203, seqlen_kv=113),           # rows that see no key
    dict(inputs="large_logits"),
    dict(seqlens_q=[50, 1, 77], mask="causal", backward=False),  # forward-only packed
    dict(batch=2, seqlen_q=2, seqlen_kv=45, decode=True, mask="causal"),
], ids=["no-key-rows", "large-logits", "packed-forward", "decode"])
def test_correct_backends_lse_is_judged_and_passes(backend, dtype, fields):
    record = run_single_case(make_case("t", {**BASE, "backend": backend, "dtype": dtype,
                                             **fields}), NO_TIMING)
    assert record["verdict"] == "pass", record["reason"]
    lse = [c for c in record["checks"] if c["check"] == "lse"]
    assert len(lse) == 1 and lse[0]["passed"]
    section = record["accuracy"]["lse"]
    assert section["max_scaled"] <= 0.5 * section["bound"], section  # 2x headroom at least


def test_a_backend_that_returns_no_lse_has_no_lse_check():
    record = run_single_case(make_case("t", {**BASE, "backend": "sdpa", "dtype": "bf16"}),
                             NO_TIMING)
    assert "lse" not in record["accuracy"] and all(c["check"] != "lse" for c in record["checks"])
