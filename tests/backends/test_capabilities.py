"""What a backend declares (:class:`Capabilities`) and the one refusal both case runners ask.

A third-party backend declares plain attributes and methods; the record reads them as the harness
always has. The single-device runner and the CP/TP runner refuse a case with the same text from
the same function, in one order; a flag declared wrongly (or not at all) ends in the verdict it
should: ``unsupported`` for a missing declaration, ``fail`` for a false one.

The CP/TP runner is called in this process as rank 0 of a pool of ``cp x tp`` (its environment
set by monkeypatch): a refusal is decided before any communication, so no pool is needed.
Backends are loaded as ``test_capabilities:<Name>`` (pytest puts tests/ on sys.path). Tiny
shapes, CPU, about 5 s.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attnbench.backends import Capabilities, World, get_backend, load_object, refusal
from attnbench.backends.naive import NaiveBackend
from attnbench.execution.multi import run_parallel_case
from attnbench.execution.single import run_single_case
from attnbench.problem.dropout import hash_keep_mask
from attnbench.sweep.case import make_case
from attnbench.sweep.options import RunOptions, TimingOptions

CPU = torch.device("cpu")
NO_TIMING = RunOptions(timeout_s=60, timing=TimingOptions(enabled=False))
DENSE = dict(batch=1, seqlen_q=32, seqlen_kv=32, heads_q=4, heads_kv=2, head_dim=16,
             dtype="fp32")
PACK = dict(seqlens_q=[5, 17, 1, 9], heads_q=4, heads_kv=2, head_dim=16, dtype="fp32")
FP8 = dict(batch=2, seqlen_q=32, heads_q=4, heads_kv=2, head_dim=32, dtype="fp8_e4m3")
PAGED = dict(batch=2, seqlen_q=2, seqlen_kv=45, heads_q=4, heads_kv=2, head_dim=32, decode=True,
             mask="causal", page_size=16)

# Today's texts, word for word (records of earlier runs hold them).
RING = ("ring/zigzag CP: backend 'plain' has no backward_from_stats(q, k, v, out, lse, dout, "
        "spec) to recompute a block's gradients from the merged softmax statistics (see "
        "attnbench.backends.base); cp_algo: allgather needs none")
PACKED = ("backend 'test_capabilities:Plain' does not declare packed (variable-length) support "
          "(supports_packed = True; see attnbench/problem/packing.py)")
CHUNKS = ("packed CP: backend 'test_capabilities:Plain' does not declare that it places chunks "
          "of packed sequences (supports_packed_chunks = True; AttnSpec.seq_q_start and "
          "seqlens_q_total, see attnbench.parallel.layout)")
FP8_PATH = "test_capabilities:Plain has no fp8 path (it does not declare supports_fp8)"
CONTIGUOUS = "test_capabilities:Plain reads a contiguous KV cache only (no paged_kv)"
NO_SOFTCAP = "plain: no softcap"


# -- backends as users write them ----------------------------------------------------------------


class Plain:
    """A third-party backend: no base class, nothing but the protocol and a few attributes
    (``paged_kv`` deliberately any true value, ``input_precision`` deliberately not callable)."""

    name = "plain"
    keep_mask = staticmethod(hash_keep_mask)
    deterministic = 0
    paged_kv = "yes"
    input_precision = ("out",)  # not a method: not a declaration

    def __init__(self):
        self._naive = NaiveBackend()

    def supports(self, case, device):
        return NO_SOFTCAP if case.softcap else None

    def forward(self, q, k, v, spec):
        return self._naive.forward(q, k, v, spec)

    def backward(self, ctx, dout):
        return self._naive.backward(ctx, dout)


class Declares(Plain):
    """Every flag and hook declared."""

    deterministic = True
    supports_packed = True
    supports_packed_chunks = True
    supports_fp8 = True

    def input_precision(self, case, device):
        return ("out",)

    def backward_from_stats(self, q, k, v, out, lse, dout, spec):
        return self._naive.backward_from_stats(q, k, v, out, lse, dout, spec)

    def parallel_algorithm(self, case):
        return None


class PagedWithoutSaying(NaiveBackend):
    """naive reads the paged cache through its block table, but this copy drops the
    declaration (``paged_kv`` missing, as a third party may forget it)."""

    name = "paged_without_saying"
    paged_kv = False


class Fp8IgnoringDescales(NaiveBackend):
    """Declares ``supports_fp8`` but takes the fp8 values as they are, without their descales:
    the scores and the output are off by the scales (a kernel that drops ``descale_q/k/v``)."""

    name = "fp8_ignoring_descales"

    def dequantized(self, q, k, v, spec):
        return q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16)


# -- the record ----------------------------------------------------------------------------------


def test_the_record_reads_a_plain_third_party_class():
    backend = get_backend("test_capabilities:Plain")  # through the registry, as a sweep names it
    assert type(backend) is Plain and backend.name == "plain"
    assert Capabilities.of(backend) == Capabilities(keep_mask=hash_keep_mask, paged_kv=True)
    declared = Capabilities.of(Declares())
    assert declared.deterministic and declared.supports_packed and declared.supports_fp8
    assert declared.supports_packed_chunks and declared.paged_kv
    for hook in ("input_precision", "backward_from_stats", "parallel_algorithm"):
        assert getattr(declared, hook).__name__ == hook
    with pytest.raises(dataclasses.FrozenInstanceError):
        declared.supports_fp8 = False  # type: ignore[misc]


def test_a_backend_that_declares_nothing_gets_every_default():
    class Bare:
        def supports(self, case, device): ...
        def forward(self, q, k, v, spec): ...
        def backward(self, ctx, dout): ...

    assert Capabilities.of(Bare()) == Capabilities()
    assert Capabilities() == Capabilities(keep_mask=None, input_precision=None,
                                          deterministic=False, supports_packed=False,
                                          supports_packed_chunks=False, supports_fp8=False,
                                          paged_kv=False, backward_from_stats=None,
                                          parallel_algorithm=None)


def test_one_resolver_for_backends_and_rank_functions():
    assert load_object("attnbench.backends.naive:NaiveBackend") is NaiveBackend
    assert load_object("attnbench.backends.naive:NaiveBackend.forward") is NaiveBackend.forward
    with pytest.raises(ValueError, match="'naive' is not of the form 'module:object'"):
        load_object("naive")
    with pytest.raises(ValueError, match="not of the form 'module:function'"):
        load_object("attnbench.execution.case_runner", "function")


# -- one refusal, two runners --------------------------------------------------------------------


def _single(fields: dict, backend: str = "test_capabilities:Plain") -> dict:
    return run_single_case(make_case("t", {"backend": backend, **fields}), NO_TIMING, CPU)


def _multi(monkeypatch, case) -> dict:
    """The CP/TP runner's record for ``case`` as rank 0 of its pool (refusals only: a case that
    is not refused would wait for its peers)."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", str(case.world_size))
    return run_parallel_case(case, NO_TIMING)


@pytest.mark.parametrize("cp_algo", ["ring", "zigzag"])
def test_ring_cp_refuses_a_backend_without_backward_from_stats(monkeypatch, cp_algo):
    case = make_case("t", dict(backend="test_capabilities:Plain", cp=2, cp_algo=cp_algo,
                               **DENSE))
    record = _multi(monkeypatch, case)
    assert (record["verdict"], record["reason"]) == ("unsupported", RING)
    backend = get_backend(case.backend)
    assert refusal(backend, case, CPU, World(cp=2, tp=1, ring=True)) == RING
    # all-gather CP and TP recompute nothing from merged statistics; a backend that has the
    # hook, or brings its own split (then ``ring`` is False), is not refused
    assert refusal(backend, case.replace(cp_algo="allgather"), CPU, World(cp=2, tp=1)) is None
    assert refusal(Declares(), case, CPU, World(cp=2, tp=1, ring=True)) is None


@pytest.mark.parametrize("what, backend, fields, world, reason", [
    ("packed", "Plain", PACK, dict(cp=2), PACKED),
    ("packed", "Plain", PACK, dict(tp=2), PACKED),
    ("the backend's own supports()", "Plain", dict(DENSE, softcap=5.0), dict(tp=2), NO_SOFTCAP),
    ("fp8 (forward only)", "Plain", FP8, dict(tp=2), FP8_PATH),
    ("paged decode (forward only)", "Dense", PAGED, dict(tp=2),
     CONTIGUOUS.replace("Plain", "Dense")),
])
def test_both_runners_refuse_with_the_same_text(monkeypatch, what, backend, fields, world,
                                                reason):
    """fp8 and decode cases run on one device (the sweep's rules refuse cp or tp > 1 for them);
    asked anyway, the CP/TP runner gives the single-device runner's answer: it is one chain."""
    case = make_case("t", {"backend": f"test_capabilities:{backend}", **fields})
    alone = run_single_case(case, NO_TIMING, CPU)
    assert (alone["verdict"], alone["reason"]) == ("unsupported", reason), what
    split = _multi(monkeypatch, case.replace(**world))
    assert (split["verdict"], split["reason"]) == ("unsupported", reason), what


class Dense(Plain):
    """``Plain`` without ``paged_kv``."""

    paged_kv = False


def test_packed_cp_needs_packed_chunks_in_the_cp_runner_only(monkeypatch):
    class_name = "test_capabilities:PackedOnly"
    case = make_case("t", {"backend": class_name, **PACK})
    assert _single(PACK, class_name)["verdict"] == "pass"
    record = _multi(monkeypatch, case.replace(cp=2, cp_algo="allgather"))
    assert (record["verdict"], record["reason"]) == (
        "unsupported", CHUNKS.replace("Plain", "PackedOnly"))


class PackedOnly(Plain):
    supports_packed = True


def test_refusal_precedence_is_one_order_for_both_runners():
    """packed, fp8, supports(), paged, then (CP/TP only) packed chunks and ring: each step
    answers only when every earlier one had nothing to say."""
    backend = get_backend("test_capabilities:Dense")
    base = make_case("t", {"backend": "test_capabilities:Dense", **PACK})
    ring = World(cp=2, tp=1, ring=True)
    everything = base.replace(dtype="fp8_e4m3", softcap=5.0, page_size=16, cp=2)
    steps = [
        (everything, PACKED.replace("Plain", "Dense")),
        (everything.replace(seqlens_q=(), seqlens_kv=()), FP8_PATH.replace("Plain", "Dense")),
        (everything.replace(seqlens_q=(), seqlens_kv=(), dtype="fp32"), NO_SOFTCAP),
        (everything.replace(seqlens_q=(), seqlens_kv=(), dtype="fp32", softcap=0.0),
         CONTIGUOUS.replace("Plain", "Dense")),
    ]
    for case, reason in steps:
        assert refusal(backend, case, CPU) == reason
        assert refusal(backend, case, CPU, ring) == reason
    dense = steps[-1][0].replace(page_size=0)
    assert refusal(backend, dense, CPU) is None
    assert refusal(backend, dense, CPU, ring) == RING
    chunked = dense.replace(seqlens_q=base.seqlens_q, seqlens_kv=base.seqlens_kv)
    assert refusal(PackedOnly(), chunked, CPU) is None
    assert refusal(PackedOnly(), chunked, CPU, ring) == CHUNKS.replace("'test_capabilities:Plain'",
                                                                       "'test_capabilities:Dense'")


# -- flags declared wrongly ----------------------------------------------------------------------


def test_a_missing_paged_kv_is_unsupported_not_timed_as_contiguous():
    record = _single(PAGED, "test_capabilities:PagedWithoutSaying")
    assert record["verdict"] == "unsupported"
    assert record["reason"] == ("test_capabilities:PagedWithoutSaying reads a contiguous KV "
                                "cache only (no paged_kv)")
    assert _single(PAGED, "naive")["verdict"] == "pass"  # the same code, declared


def test_a_false_supports_fp8_fails_the_case():
    record = _single(FP8, "test_capabilities:Fp8IgnoringDescales")
    assert record["verdict"] == "fail", record["reason"]
    assert "out" in record["reason"]
    assert _single(FP8, "naive")["verdict"] == "pass"  # with its descales
