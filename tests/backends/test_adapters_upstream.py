"""The third-party adapters against what their packages do, on CPU.

flash-attn, FlashAttention-3, TransformerEngine and xformers need a GPU and are not installed
here. The stand-ins of :mod:`upstream_standins` have their signatures, assert what their
sources assert about the arguments, and compute attention by their documented conventions;
each adapter's output (and TE's gradients) is compared with attnbench's fp64 reference on the
same problem. Every test names the bug it catches (a mutant of today's adapter or of the fix).

Legend: B = batch, Hq / Hkv = heads, Sq / Sk = lengths, D = head dim. fp16: the half dtype the
libraries take; a wrong mask or alignment is an O(1) error, rounding 2^-11.
"""

from __future__ import annotations

import random

import pytest
import torch

from attnbench.accuracy.bounds import tensor_errors
from attnbench.backends import Unsupported
from attnbench.backends.call_window import CallWindow, local_window
from attnbench.problem.attn_spec import AttnSpec
from attnbench.problem.inputs import make_inputs
from attnbench.problem.reference import reference_backward, reference_forward
from attnbench.sweep.case import make_case
from upstream_standins import (fake_flash_attn, fake_flash_attn3, fake_transformer_engine,
                               fake_xformers)

CUDA = torch.device("cuda")  # supports() is asked about a GPU; nothing runs on it
TOLERANCE = 2.0 ** -8
"""Relative L2 of an fp16 output against fp64: rounding is ~2^-11; a mask off by one key or an
ALiBi bias from the wrong corner is >= 2^-5 on these sizes."""


def _case(backend: str, **fields):
    """A small case; ``mask={"window": [left, right]}`` as a sweep spells it."""
    base = dict(backend=backend, batch=2, seqlen_q=32, heads_q=4, heads_kv=2, head_dim=16,
                dtype="fp16")
    if isinstance(fields.get("mask"), dict):
        left, right = fields.pop("mask")["window"]
        fields.update(mask="window", window_left=left, window_right=right)
    case = make_case("t", {**base, **fields})
    assert case.window_bounds == (case.window_left, case.window_right) or case.mask != "window"
    return case


def _problem(case, chunk=None):
    """(q, k, v, dout, spec) of ``case``; ``chunk=(start, length)``: the query rows of one
    all-gather CP rank, with every key, and the spec that places them (q_start)."""
    q, k, v, dout = make_inputs(case)
    spec = AttnSpec.from_case(case)
    if chunk:
        start, length = chunk
        q, dout = q[:, :, start:start + length].contiguous(), dout[:, :, start:start + length]
        spec = spec.replace(q_start=start)
    return q, k, v, dout.contiguous(), spec


def _error(out, q, k, v, spec) -> float:
    exact, _ = reference_forward(q, k, v, spec)
    return tensor_errors(out, exact)["rel_l2"]


# -- what the installed package takes ------------------------------------------------------------


def test_upstream_names_the_release_and_the_missing_keywords(monkeypatch):
    """Mutants: ``lacking`` that ignores the signature -> None; one that lists every name
    -> "softmax_scale" in the reason; ``version_of`` without the module's ``__version__``
    fallback -> "(version unknown)"."""
    from attnbench.backends.upstream import keywords, lacking, older_than, version_of
    from upstream_standins import install

    def old(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1)):
        pass

    def anything(q, **kwargs):
        pass

    install(monkeypatch, "somelib", __version__="2.5.9+cu12", old=old)
    assert version_of("somelib") == "somelib 2.5.9+cu12" and older_than("somelib", "2.6")
    assert not older_than("somelib", "2.5.9") and version_of("absentlib").endswith("unknown)")
    assert keywords(anything) is None and lacking("somelib", anything, ["softcap"]) is None
    assert lacking("somelib", old, ["softmax_scale", "causal"]) is None
    assert lacking("somelib", old, ["softmax_scale", "softcap", "alibi_slopes"],
                   since={"softcap": "2.6", "window_size": "2.3"}) == (
        "somelib 2.5.9+cu12: old takes no softcap, alibi_slopes (softcap since 2.6)")


# -- the call's window -----------------------------------------------------------------------------


def _visible(left, right, offset, sq, keys):
    return {(i, j) for i in range(sq) for j in keys
            if (right < 0 or j - (i + offset) <= right) and (left < 0 or j - (i + offset) >= -left)}


def test_local_window_says_what_attnbench_means_or_refuses():
    """Brute force over chunks, lengths and windows: the keys a library sees through
    ``local_window`` (its cut, its bottom-right window) are exactly the keys attnbench's spec
    makes visible. Mutant: no shift (the window passed as the spec has it) -> 79 % of the
    chunks off their corner see other keys."""
    rng = random.Random(0)
    checked = 0
    for _ in range(4000):
        total_q, total_k = rng.randint(1, 40), rng.choice([None, rng.randint(1, 40)])
        total_k = total_k or total_q
        sq = max(1, total_q // rng.randint(1, 4))
        start = rng.randint(0, total_q - sq)
        left, right = rng.choice([-1, rng.randint(0, 9)]), rng.choice([-1, 0, rng.randint(0, 9)])
        spec = AttnSpec(scale=1.0, window_left=left, window_right=right, q_start=start,
                        seqlen_q_total=total_q, seqlen_kv_total=total_k)
        diag = start + total_k - total_q
        try:
            window = local_window(spec, sq, total_k, library="lib")
        except Unsupported as exc:
            assert not _visible(left, right, diag, sq, range(total_k)), exc  # only nothing seen
            continue
        first, end = window.keys or (0, total_k)
        seen = {(i, j + first) for i, j in _visible(window.left, window.right,
                                                     (end - first) - sq, sq, range(end - first))}
        assert seen == _visible(left, right, diag, sq, range(total_k)), (spec, window)
        if left < 0 and right == 0:
            assert window.causal
        checked += 1
    assert checked > 3500


def test_a_causal_chunk_is_cut_at_its_end_and_stays_plain_causal():
    spec = AttnSpec(scale=1.0, window_right=0, seqlen_q_total=1024, seqlen_kv_total=1024,
                    q_start=256)
    assert local_window(spec, 256, 1024, alibi=True, library="lib") == CallWindow(-1, 0, (0, 512))
    last = spec.replace(q_start=768)
    assert local_window(last, 256, 1024, alibi=True, library="lib") == CallWindow(-1, 0)
    with pytest.raises(Unsupported, match="ALiBi distances from each call's bottom-right"):
        local_window(spec.replace(window_right=-1), 256, 1024, alibi=True, library="lib")


# -- flash-attn 2 ----------------------------------------------------------------------------------


FA2_PROBLEMS = {
    "causal-bottom-right": (dict(mask="causal", seqlen_kv=48), None),
    "window": (dict(mask={"window": [5, 3]}, seqlen_kv=40), None),
    "causal-window": (dict(mask={"window": [6, 0]}), None),
    "alibi-softcap": (dict(bias="alibi", softcap=5.0), None),
    "chunk-causal": (dict(mask="causal"), (8, 8)),
    "chunk-causal-alibi": (dict(mask="causal", bias="alibi"), (16, 8)),
    "chunk-window": (dict(mask={"window": [5, 2]}), (8, 8)),
    "chunk-left-window": (dict(mask={"window": [5, -1]}), (8, 16)),
}


@pytest.mark.parametrize("name", FA2_PROBLEMS)
def test_flash_attn_computes_the_cases_problem(monkeypatch, name):
    """Every mask, alignment and bias through flash-attn's conventions gives attnbench's
    attention -- also for a chunk of queries with every key (all-gather CP: ``q_start``).
    Mutant (today's adapter): ``window_size=(left, right)`` of the case for every call ->
    every chunk-* case is attention of another problem (rel. error 0.95 to 1.4, bound 2^-8)."""
    from attnbench.backends.adapters import FlashAttnBackend

    calls = fake_flash_attn(monkeypatch)
    fields, chunk = FA2_PROBLEMS[name]
    q, k, v, _, spec = _problem(_case("flash_attn", **fields), chunk)
    out = FlashAttnBackend().forward(q, k, v, spec).out
    assert _error(out, q, k, v, spec) < TOLERANCE
    if fields.get("mask") == "causal":
        assert calls[-1]["causal"] is True and calls[-1]["window_size"] == (-1, -1)


@pytest.mark.parametrize("call", ["dense", "packed"])
def test_flash_attn_rows_that_see_no_key_have_lse_minus_inf(monkeypatch, call):
    """FA2 writes +inf as the log-sum-exp of a row that sees no key (softmax.h: ``sum == 0 ?
    INFINITY``; the stand-in does too); attnbench's convention -- the reference's, and what a
    ring CP merge weighs as 0 -- is -inf. Mutant: passing FA2's lse through gives +inf rows
    (issue 43 item 5: forward-only ring CP with FA2)."""
    from attnbench.backends.adapters import FlashAttnBackend

    fake_flash_attn(monkeypatch)
    fields = (dict(mask="causal", seqlen_kv=8) if call == "dense" else
              dict(seqlens_q=[24, 8], seqlens_kv=[4, 8], seqlen_q=32, batch=1, mask="causal"))
    q, k, v, _, spec = _problem(_case("flash_attn", **fields))
    lse = FlashAttnBackend().forward(q, k, v, spec).lse
    _, exact = reference_forward(q, k, v, spec)
    unseen = exact == float("-inf")
    assert unseen.any() and not (lse == float("inf")).any()
    assert (lse[unseen] == float("-inf")).all()
    assert (lse[~unseen].double() - exact[~unseen]).abs().max() < 1e-3


def test_flash_attn_refuses_alibi_on_a_chunk_away_from_the_corner(monkeypatch):
    from attnbench.backends.adapters import FlashAttnBackend

    fake_flash_attn(monkeypatch)
    q, k, v, _, spec = _problem(_case("flash_attn", bias="alibi"), (8, 8))
    with pytest.raises(Unsupported, match="flash_attn measures ALiBi distances"):
        FlashAttnBackend().forward(q, k, v, spec)


@pytest.mark.parametrize("page_size", [0, 256])
def test_flash_attn_decode_passes_plain_causal_and_keeps_the_gqa_fast_path(monkeypatch,
                                                                          page_size):
    """FA2 decode sent causal as ``window_size=(-1, 0)``: mha_fwd_kvcache then keeps
    ``window_size_right = 0`` and never swaps Sq = 1 with the GQA group
    (``seqlenq_ngroups_swapped``), which understates its GB/s by up to the group size. Now plain
    ``causal=True`` (mutant: the old window -> swapped False)."""
    from attnbench.backends.adapters import FlashAttnBackend

    calls = fake_flash_attn(monkeypatch)
    case = _case("flash_attn", seqlen_q=1, seqlen_kv=300, heads_q=8, heads_kv=2, decode=True,
                 mask="causal", page_size=page_size)
    q, k, v, _, spec = _problem(case)
    backend = FlashAttnBackend()
    assert backend.supports(case, CUDA) is None
    out = backend.forward(q, k, v, spec).out
    assert calls[-1]["causal"] is True and calls[-1]["window_size"] == (-1, -1)
    assert calls[-1]["swapped"] is True
    assert _error(out, q, k, v, spec) < TOLERANCE


def test_flash_attn_packed_passes_plain_causal(monkeypatch):
    from attnbench.backends.adapters import FlashAttnBackend

    calls = fake_flash_attn(monkeypatch)
    case = _case("flash_attn", seqlens_q=[7, 1, 20], batch=3, seqlen_q=28, mask="causal",
                 heads_kv=4)
    q, k, v, _, spec = _problem(case)
    out = FlashAttnBackend().forward(q, k, v, spec).out
    assert {c["causal"] for c in calls} == {True}
    assert _error(out, q, k, v, spec) < TOLERANCE


@pytest.mark.parametrize("fields, reason", [
    (dict(softcap=5.0, dropout=0.1), "refuses softcap with dropout"),
    (dict(head_dim=64, head_dim_v=32), "takes one head dim for q, k and v"),
    (dict(head_dim=288), "head_dim at most 256"),
])
def test_flash_attn_refuses_what_flash_api_rejects(monkeypatch, fields, reason):
    """Each ran before and failed inside flash-attn (an ``error`` record, or -- softcap with
    dropout -- a RuntimeError in the middle of a sweep). Mutant: drop the check -> None."""
    from attnbench.backends.adapters import FlashAttnBackend

    fake_flash_attn(monkeypatch)
    assert reason in FlashAttnBackend().supports(_case("flash_attn", **fields), CUDA)


def test_flash_attn_before_2_6_is_refused_softcap_with_its_version(monkeypatch):
    """flash-attn 2.5.9's ``flash_attn_func`` has no ``softcap``: the adapter passed
    ``softcap=0.0`` to every call (a TypeError on every case); now it passes softcap only when
    the case has one, and refuses such cases naming the release (mutant: always pass it ->
    TypeError below)."""
    from attnbench.backends.adapters import FlashAttnBackend

    fake_flash_attn(monkeypatch, version="2.5.9")
    backend = FlashAttnBackend()
    reason = backend.supports(_case("flash_attn", softcap=5.0), CUDA)
    assert reason == ("flash_attn 2.5.9: flash_attn_func takes no softcap (softcap since 2.6)")
    plain = _case("flash_attn", mask="causal")
    assert backend.supports(plain, CUDA) is None
    q, k, v, _, spec = _problem(plain)
    assert _error(backend.forward(q, k, v, spec).out, q, k, v, spec) < TOLERANCE


# -- FlashAttention-3 ------------------------------------------------------------------------------


@pytest.mark.parametrize("fields, reason", [
    (dict(dtype="fp8_e4m3", head_dim=40), "head_dim that is a multiple of 16 in fp8, not 40"),
    (dict(head_dim=20), "head_dim that is a multiple of 8, not 20"),
    (dict(head_dim=128, head_dim_v=64), "not 128/64"),
    (dict(head_dim=320), "head dims of at most 256 (Q/K), not 320/320"),
    (dict(head_dim=64, head_dim_v=384), "head dims of at most 256 (backward), not 64/384"),
    (dict(head_dim=64, head_dim_v=384, backward=False, dtype="fp8_e4m3"),
     "head_dim_v > 256 in fp16 and bf16 only"),
])
def test_flash_attn3_refuses_what_its_mha_fwd_rejects(monkeypatch, fields, reason):
    """Mutant: drop :func:`fa3_limits` -> None, and FA3 fails on the GPU mid-sweep. A forward
    of V head dim 384 on Q/K 64 in bf16 is FA3's to run (mutant: refuse every dim > 256)."""
    from attnbench.backends.flash_attn3 import FlashAttn3Backend

    fake_flash_attn3(monkeypatch)
    assert reason in FlashAttn3Backend().supports(_case("flash_attn3", **fields), CUDA)
    wide = _case("flash_attn3", head_dim=64, head_dim_v=384, backward=False, dtype="bf16")
    assert FlashAttn3Backend().supports(wide, CUDA) is None


def test_flash_attn3_refuses_the_old_descale_names_with_its_version(monkeypatch):
    """FA3 before its 2025-01 rewrite names the descales ``descale_q`` and takes one value per
    tensor: the adapter passed ``q_descale=`` (a TypeError). Mutant: no signature check -> the
    stand-in's AssertionError."""
    from attnbench.backends.flash_attn3 import FlashAttn3Backend

    fake_flash_attn3(monkeypatch, old_names=True)
    reason = FlashAttn3Backend().supports(_case("flash_attn3", dtype="fp8_e4m3"), CUDA)
    assert reason.startswith("flash_attn_interface (version unknown): flash_attn_func takes "
                             "descale_q/k/v, one value per tensor")


def test_flash_attn3_computes_a_causal_chunk(monkeypatch):
    from attnbench.backends.flash_attn3 import FlashAttn3Backend

    calls = fake_flash_attn3(monkeypatch)
    q, k, v, _, spec = _problem(_case("flash_attn3", mask="causal"), (8, 8))
    out = FlashAttn3Backend().forward(q, k, v, spec).out
    assert calls[-1]["causal"] is True and calls[-1]["k"].shape[1] == 16  # cut at the end
    assert _error(out, q, k, v, spec) < TOLERANCE


# -- TransformerEngine -----------------------------------------------------------------------------


TE_PROBLEMS = {
    "causal-bottom-right": (dict(mask="causal", seqlen_kv=48), None),
    "causal-window-bottom-right": (dict(mask={"window": [6, 0]}, seqlen_kv=48), None),
    "two-sided-window": (dict(mask={"window": [5, 3]}, seqlen_kv=40), None),
    "head-dims-differ": (dict(head_dim=16, head_dim_v=8, mask="causal"), None),
    "alibi": (dict(bias="alibi", seqlen_kv=40), None),
    "chunk-causal-alibi": (dict(mask="causal", bias="alibi"), (16, 8)),
    "chunk-causal-window": (dict(mask={"window": [6, 0]}), (8, 8)),
}


@pytest.mark.parametrize("name", TE_PROBLEMS)
def test_transformer_engine_computes_the_cases_problem_and_gradients(monkeypatch, name):
    """Contiguous (B, S, H, D) inputs (TE's cuDNN path reads the layout by name), bottom-right
    masks (``causal_bottom_right``, also with a window (W, 0)), ``kv_channels=(D, Dv)``, global
    offsets: output and dQ, dK, dV equal attnbench's. Mutants (today's adapter): transposed
    views -> the stand-in's layout assertion; ``no_mask`` + (W, 0) -> FusedAttention's top-left
    window (rel. error 1.41, bound 2^-8); ``kv_channels=D`` with Dv != D -> the head-dim
    assertion; the window of the case on a chunk -> another problem."""
    from attnbench.backends.transformer_engine import TransformerEngineBackend

    calls = fake_transformer_engine(monkeypatch)
    fields, chunk = TE_PROBLEMS[name]
    q, k, v, dout, spec = _problem(_case("transformer_engine", **fields), chunk)
    backend = TransformerEngineBackend()
    fwd = backend.forward(q, k, v, spec)
    exact, lse = reference_forward(q, k, v, spec)
    assert tensor_errors(fwd.out, exact)["rel_l2"] < TOLERANCE
    grads = backend.backward(fwd.ctx, dout)
    for got, want in zip(grads, reference_backward(q, k, v, exact, lse, dout, spec)):
        assert got.shape == want.shape and tensor_errors(got, want)["rel_l2"] < TOLERANCE
    if "causal" in name:
        assert calls[-1]["mask"] == "causal_bottom_right"


def test_transformer_engine_copies_its_inputs_once(monkeypatch):
    """The contiguous copies are part of the case, not of the timed call: the same tensors
    reach TE on every call (mutant: copy in the call -> new tensors each time); new inputs (the
    dropout probe's V) get new copies."""
    from attnbench.backends.transformer_engine import TransformerEngineBackend

    calls = fake_transformer_engine(monkeypatch)
    q, k, v, dout, spec = _problem(_case("transformer_engine", mask="causal"))
    backend = TransformerEngineBackend()
    for _ in range(2):
        backend.backward(backend.forward(q, k, v, spec).ctx, dout)
    assert calls[0]["q"] is calls[1]["q"] and calls[0]["k"] is calls[1]["k"]
    backend.forward(q, k, v.clone(), spec)
    assert calls[2]["q"] is not calls[1]["q"]


@pytest.mark.parametrize("window", [[5, -1], [-1, 3]])
def test_transformer_engine_refuses_one_sided_windows(monkeypatch, window):
    """TE's check_set_window_size asserts on (L, -1) and (-1, R > 0) with ``no_mask``
    (mutant: let them through -> an AssertionError from TE on the GPU)."""
    from attnbench.backends.transformer_engine import TransformerEngineBackend

    fake_transformer_engine(monkeypatch)
    reason = TransformerEngineBackend().supports(
        _case("transformer_engine", mask={"window": window}), CUDA)
    assert reason.startswith("transformer_engine takes the windows (-1, -1), (-1, 0) and (>=0, "
                             ">=0) only")


def test_transformer_engine_before_1_10_refuses_two_head_dims_with_its_version(monkeypatch):
    from attnbench.backends.transformer_engine import TransformerEngineBackend

    fake_transformer_engine(monkeypatch, version="1.9.0")
    backend = TransformerEngineBackend()
    reason = backend.supports(_case("transformer_engine", head_dim=16, head_dim_v=8), CUDA)
    assert reason.startswith("transformer_engine 1.9.0: DotProductAttention takes one head size")
    assert backend.supports(_case("transformer_engine"), CUDA) is None


# -- xformers --------------------------------------------------------------------------------------


def test_xformers_dense_bias_is_aligned_for_any_key_length(monkeypatch):
    """xformers wants every stride of a bias but the last a multiple of 8 halves: a dense bias
    of 45 keys was refused by its kernels. Now a slice of one padded to 48 (mutant: no padding
    -> the stand-in's alignment assertion)."""
    from attnbench.backends.adapters import XformersBackend

    calls = fake_xformers(monkeypatch)
    q, k, v, _, spec = _problem(_case("xformers", bias="alibi", mask="causal", seqlen_kv=45))
    out = XformersBackend().forward(q, k, v, spec).out
    bias = calls[-1]["attn_bias"]
    assert bias.shape[-1] == 45 and bias.stride(-2) == 48
    assert _error(out, q, k, v, spec) < TOLERANCE
