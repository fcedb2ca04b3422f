"""Packed (variable-length) cases through the harness: the reference and baselines per
sequence, FLOPs, backends that support the layout and those that must say why not."""

from __future__ import annotations

import pytest
import torch

from attnbench.accuracy.bounds import identity_bounds
from attnbench.accuracy.fused_baseline import fused_backward, fused_forward
from attnbench.accuracy.invariants import identity_residuals
from attnbench.backends import get_backend
from attnbench.backends.capabilities import refusal
from attnbench.execution.case_runner import run_case
from attnbench.problem.attn_spec import AttnSpec
from attnbench.problem.dropout import hash_keep_mask
from attnbench.problem.inputs import make_inputs
from attnbench.problem.packing import segments, sequence_spec
from attnbench.problem.reference import reference_backward, reference_forward
from attnbench.report.read.data import flatten
from attnbench.sweep.case import make_case
from attnbench.sweep.flops import case_bytes, case_flops, visible_pairs
from attnbench.sweep.options import RunOptions, TimingOptions

NO_TIMING = RunOptions(timeout_s=120, timing=TimingOptions(enabled=False))
PACK = dict(seqlens_q=[5, 17, 1, 33], seqlens_kv=[9, 3, 4, 40], heads_q=4, heads_kv=2,
            head_dim=16)


def packed(backend="naive", **fields):
    return make_case("t", {"backend": backend, **PACK, **fields})


@pytest.mark.parametrize("fields", [dict(mask="causal", bias="alibi", dropout=0.2, dtype="bf16"),
                                    dict(mask="window", window_left=3, window_right=2,
                                         softcap=5.0, dtype="fp32")])
def test_each_sequence_is_its_own_dense_problem(fields):
    """The definition: sequence b of a pack is exactly a dense case of that sequence with batch
    index b (its masks, ALiBi and dropout draws) -- for the reference, the fused baseline and
    naive alike; no row of one sequence depends on another's keys."""
    case = packed(**fields)
    spec = AttnSpec.from_case(case)
    q, k, v, dout = make_inputs(case)
    assert q.shape == (1, 4, 56, 16) and k.shape == (1, 2, 56, 16)
    out, lse = reference_forward(q, k, v, spec, hash_keep_mask)
    grads = reference_backward(q, k, v, out, lse, dout, spec, hash_keep_mask)
    naive = get_backend("naive")
    fwd = naive.forward(q, k, v, spec)
    naive_grads = naive.backward(fwd.ctx, dout)
    f_out, f_lse = fused_forward(q, k, v, spec, hash_keep_mask)
    f_grads = fused_backward(q, k, v, f_out, f_lse, dout, spec, hash_keep_mask)
    for seg in segments(spec.cu_seqlens_q, spec.cu_seqlens_kv):
        sub = sequence_spec(spec, seg)
        rows, keys = slice(seg.q0, seg.q1), slice(seg.k0, seg.k1)
        args = (q[:, :, rows], k[:, :, keys], v[:, :, keys])
        o1, l1 = reference_forward(*args, sub, hash_keep_mask)
        assert torch.equal(o1, out[:, :, rows]) and torch.equal(l1, lse[:, :, rows])
        g1 = reference_backward(*args, o1, l1, dout[:, :, rows], sub, hash_keep_mask)
        for whole, part, cut in zip(grads, g1, (rows, keys, keys)):
            assert torch.equal(part, whole[:, :, cut])
        dense = naive.forward(*args, sub)
        assert torch.equal(dense.out, fwd.out[:, :, rows])
        fo, _ = fused_forward(*args, sub, hash_keep_mask)
        assert torch.equal(fo, f_out[:, :, rows])
    for mine in (naive_grads, f_grads):
        for a, b in zip(mine, grads):
            assert (a.double() - b).norm() / b.norm() < 2e-2


def test_flops_count_pairs_within_each_sequence_only():
    case = packed(mask="causal")
    pairs = sum(visible_pairs(lq, lk, -1, 0) for lq, lk in zip(case.seqlens_q, case.seqlens_kv))
    assert case_flops(case)[0] == 2.0 * case.heads_q * pairs * (16 + 16)
    # by hand, bottom-right per sequence: 5 rows see 5..9 keys, the last 3 of 17 rows see 1..3,
    # 1 row sees 4, 33 rows see 8..40
    assert pairs == 35 + 6 + 4 + 792 < visible_pairs(56, 56, -1, 0)
    fwd_bytes, _ = case_bytes(case)
    assert fwd_bytes == (56 * 4 * 16 + 2 * 56 * 2 * 16 + 56 * 4 * 16) * 2 + 56 * 4 * 4


@pytest.mark.parametrize("backend", ["naive", "reference", "sdpa"])
def test_backends_pass_a_packed_case(backend):
    record = run_case(packed(backend, heads_kv=4, dtype="bf16"), NO_TIMING)
    assert record["verdict"] == "pass", record["reason"]


@pytest.mark.parametrize("fields, reason", [
    (dict(mask="causal"), "neither is_causal nor attn_mask"),
    (dict(bias="alibi"), "neither is_causal nor attn_mask"),
    (dict(), "does not broadcast K/V heads"),
    (dict(heads_kv=4, dropout=0.1), "probe that reads it back is for dense calls only"),
])
def test_sdpa_says_why_it_cannot_run_a_packed_case(fields, reason):
    record = run_case(packed("sdpa", dtype="bf16", **fields), NO_TIMING)
    assert record["verdict"] == "unsupported" and reason in record["reason"]


def test_a_backend_that_does_not_declare_packing_is_unsupported_never_wrong():
    case = packed("mutant.base")
    assert "does not declare packed" in refusal(get_backend("mutant.base"), case,
                                                torch.device("cpu"))
    record = run_case(case, NO_TIMING)
    assert record["verdict"] == "unsupported" and "packed" in record["reason"]


def test_report_columns_of_a_packed_record():
    case = packed()
    row = flatten({"case": case.to_dict(), "verdict": "pass"})
    assert row["packed"] is True and row["sequences"] == 4 and row["tokens"] == 56
    assert row["seqlens_q"] == (5, 17, 1, 33)
    dense = flatten({"case": make_case("t", {"backend": "naive", "batch": 3}).to_dict()})
    assert dense["packed"] is False and dense["tokens"] == 3 * 128


@pytest.mark.parametrize("mutant", ["mutant.cross_document_leak", "mutant.cu_seqlens_off_by_one"])
def test_identities_per_sequence_see_a_leak_without_a_reference(mutant):
    """A forward that attends across documents, with a backward consistent with it, satisfies
    every identity over the whole pack; per sequence it cannot (a document's output then
    depends on another document's V and K)."""
    case = packed(heads_kv=2, mask="causal", dtype="fp32")
    spec = AttnSpec.from_case(case)
    q, k, v, dout = make_inputs(case)
    backend = get_backend(mutant)
    fwd = backend.forward(q, k, v, spec)
    grads = backend.backward(fwd.ctx, dout)
    whole = identity_residuals(q, k, v, fwd.out, dout, *grads)
    per_sequence = identity_residuals(q, k, v, fwd.out, dout, *grads,
                                      cu_seqlens_q=spec.cu_seqlens_q,
                                      cu_seqlens_kv=spec.cu_seqlens_kv)
    bounds = identity_bounds("fp32", None)
    assert all(whole[name] < bounds[name] for name in whole), whole
    assert max(per_sequence[n] / bounds[n] for n in per_sequence) > 100, per_sequence
    naive = get_backend("naive")
    fwd = naive.forward(q, k, v, spec)
    correct = identity_residuals(q, k, v, fwd.out, dout, *naive.backward(fwd.ctx, dout),
                                 cu_seqlens_q=spec.cu_seqlens_q,
                                 cu_seqlens_kv=spec.cu_seqlens_kv)
    assert all(correct[name] < bounds[name] / 4 for name in correct), correct


EMPTY = dict(seqlens_q=[5, 0, 17, 9], seqlens_kv=[9, 3, 0, 12], heads_q=4, heads_kv=2,
             head_dim=16)
"""A pack with a document of keys and no queries and one of queries and no keys (varlen
batches have both: a padded slot, a cache not filled yet)."""


def test_a_document_of_no_keys_gives_zeros_and_one_of_no_queries_no_gradient():
    """The reference, the fused baseline and naive agree with the convention for rows that see
    no key (zeros, lse -inf), and the keys nobody queries get zero dK and dV."""
    case = make_case("t", {"backend": "naive", **EMPTY, "mask": "causal", "bias": "alibi",
                           "softcap": 5.0, "dropout": 0.2, "dtype": "fp32"})
    spec = AttnSpec.from_case(case)
    q, k, v, dout = make_inputs(case)
    out, lse = reference_forward(q, k, v, spec, hash_keep_mask)
    dq, dk, dv = reference_backward(q, k, v, out, lse, dout, spec, hash_keep_mask)
    no_keys, no_queries = slice(5, 22), slice(9, 12)
    assert torch.equal(out[:, :, no_keys], torch.zeros_like(out[:, :, no_keys]))
    assert torch.isneginf(lse[:, :, no_keys]).all() and torch.isfinite(lse[:, :, :5]).all()
    assert not dq[:, :, no_keys].any() and not dk[:, :, no_queries].any()
    assert not dv[:, :, no_queries].any()
    f_out, f_lse = fused_forward(q, k, v, spec, hash_keep_mask)
    fwd = get_backend("naive").forward(q, k, v, spec)
    for mine, their_lse in ((f_out, f_lse), (fwd.out, fwd.lse)):
        assert torch.isfinite(mine).all() and not mine[:, :, no_keys].any()
        assert torch.isneginf(their_lse[:, :, no_keys]).all()
        assert (mine.double() - out).norm() / out.norm() < 1e-5


@pytest.mark.parametrize("backend, fields", [
    ("naive", dict(mask="causal", dropout=0.1)), ("reference", dict(bias="alibi")),
    ("sdpa", dict(heads_kv=4)), ("triton", dict(mask="causal", softcap=5.0)),
    ("mutant.base", dict()),  # a backend that does not declare packs still says so
])
def test_backends_pass_a_pack_with_empty_documents(backend, fields):
    record = run_case(make_case("t", {"backend": backend, **EMPTY, "dtype": "bf16", **fields}),
                      NO_TIMING)
    expected = "unsupported" if backend == "mutant.base" else "pass"
    assert record["verdict"] == expected, record["reason"]


def test_a_document_of_no_keys_that_divides_by_zero_is_caught():
    case = make_case("t", {"backend": "mutant.empty_document_nan", **EMPTY, "dtype": "bf16"})
    record = run_case(case, NO_TIMING)
    assert record["verdict"] == "fail" and "nonfinite" in {
        c["check"] for c in record["checks"] if not c["passed"]}
    dense = make_case("t", {"backend": "mutant.empty_document_nan", "seqlen_q": 96,
                            "seqlen_kv": 40, "mask": "causal", "dtype": "bf16"})
    assert run_case(dense, NO_TIMING)["verdict"] == "pass"  # masked rows are not its bug
