"""What a backend declares beyond the protocol, in one record, and the one refusal that reads it.

A backend declares an optional hook or flag as a plain attribute or method of its own (class
attributes in the examples below); nothing else about it changes. The harness never reads those
attributes one by one: :meth:`Capabilities.of` reads every one of them into a frozen
:class:`Capabilities`, and each reader (the two case runners, the judge, the dropout probe) goes
through that record. Each field's default is what a backend that declares nothing is taken to
be: a fused kernel that hides its dropout mask and runs dense, non-paged, non-fp8 calls.

::

    class MyBackend:                      # the protocol: attnbench.backends.base
        name = "mine"
        supports_packed = True            # flags: see the fields of Capabilities
        paged_kv = True

        def backward_from_stats(self, q, k, v, out, lse, dout, spec): ...   # hooks likewise

:func:`refusal` is the one place that decides that a backend cannot run a case: both case
runners (:mod:`attnbench.execution.single`, :mod:`attnbench.execution.multi`) ask it before
anything runs, and record what it says as ``unsupported``.

The record is built where it is read (a dozen ``getattr`` calls), not cached per backend object:
a backend may set an attribute as it runs (the judge reads ``keep_mask`` after the forward, as it
always has), and a cache keyed by the object would need objects that hash.

This module imports nothing above :mod:`attnbench.backends` (not :mod:`attnbench.parallel`, not
:mod:`attnbench.execution`): what only the CP/TP runner knows -- which split runs -- comes in as a
:class:`World` it fills.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from attnbench.dtypes import is_fp8

if TYPE_CHECKING:
    from types import ModuleType

    import torch

    from attnbench.problem.attn_spec import KeepMaskFn
    from attnbench.sweep.case import Case


@dataclass(frozen=True, kw_only=True, slots=True)
class Capabilities:
    """Every optional hook and flag a backend may declare, read from its attributes."""

    keep_mask: Optional["KeepMaskFn"] = None
    """``keep_mask(spec, batches, heads, q_pos, k_pos) -> bool tensor``: rebuilds the exact
    dropout mask the backend used (its seed and the spec's global offsets). Declared: the fp64
    reference reuses it (``exact-mask``) in :mod:`attnbench.accuracy.evaluate` and in the CP/TP
    check (:func:`attnbench.execution.multi.evaluate_parallel`). None (hidden, as in flash-attn
    and cuDNN, or drawn from ``spec.dropout_seed`` as a seeded Triton kernel does): the
    single-device runner captures the generator's state before the forward and
    :mod:`attnbench.accuracy.dropout_probe` recovers the mask (under CP/TP: a mask that follows
    the seed) or falls back to statistics."""

    input_precision: Optional[Callable[["Case", "torch.device"], tuple[str, ...]]] = None
    """``input_precision(case, device) -> tuple`` of the tensors (of out, dq, dk, dv) this
    backend computes or accumulates in the input dtype by design: they are judged against the
    naive baseline, every other tensor against the fused baseline (fp32 accumulation); read by
    :func:`attnbench.accuracy.evaluate.input_precision` for :mod:`attnbench.accuracy.bounds`.
    Not declared: a fused kernel, every tensor against the fused baseline."""

    deterministic: bool = False
    """Repeated backward calls on one forward context give bit-identical gradients. Declared:
    the single-device runner (:mod:`attnbench.execution.single`) holds the backend to it
    (:func:`attnbench.accuracy.evaluate.check_determinism`); a difference fails the case."""

    supports_packed: bool = False
    """Packed (variable-length) calls are understood: ``spec.cu_seqlens_q/kv`` delimit
    sequences in one (1, H, T, D) buffer and no sequence attends to another
    (:mod:`attnbench.problem.packing`). Not declared: a packed case is refused by
    :func:`refusal` -- a backend that does not know the layout would attend across sequences
    and give a wrong answer, never an error."""

    supports_packed_chunks: bool = False
    """A packed call whose sequences are chunks of longer ones is understood: sequence b's
    queries sit at ``spec.seq_q_start[b]`` of its ``spec.seqlens_q_total[b]`` positions (keys
    likewise), as a dense call's sit at ``q_start`` of ``seqlen_q_total``. Not declared: packed
    CP (cp > 1, :mod:`attnbench.parallel.layout`) is refused by :func:`refusal` -- a backend that
    reads only ``cu_seqlens`` would align each chunk as a whole sequence and be wrong, never
    fail."""

    supports_fp8: bool = False
    """fp8 q, k, v (``dtype: fp8_e4m3 | fp8_e5m2``) are taken with their descales in the spec
    (FA3's ``descale_q/k/v``, :mod:`attnbench.problem.fp8`); the output comes back in bf16. Not
    declared: an fp8 case is refused by :func:`refusal` -- the backend would be handed fp8
    tensors it does not know, or silently run bf16 under an fp8 case's name."""

    paged_kv: bool = False
    """A decode case's paged cache (``page_size``) is read through its block table
    (:mod:`attnbench.problem.paged`). Not declared: a paged case is refused by :func:`refusal`,
    or its times would be a contiguous cache's under a paged case's name."""

    backward_from_stats: Optional[Callable[..., tuple]] = None
    """``backward_from_stats(q, k, v, out, lse, dout, spec) -> (dq, dk, dv)``: the gradients of
    one block of a larger softmax, recomputed from that softmax's *final* output and log-sum-exp
    (P = exp(scores - lse), delta = rowsum(dout * out)), for the keys of this call only. ``out``
    (B, Hq, Sq, Dv) is in the input dtype, ``lse`` (B, Hq, Sq) float32 (-inf for rows that see
    no key at all); the dropout mask is the one ``spec`` gives (its seed and global offsets), so
    a caller that replays forward's ``spec`` replays forward's mask. Gradients come back in the
    input dtype or wider; callers sum blocks in float32. Ring and zigzag CP
    (:mod:`attnbench.parallel.ring`) need it (unless the case is forward only) and a
    ``Forward.lse`` (checked on the first block);
    without it :func:`refusal` refuses them (all-gather CP and TP need neither)."""

    parallel_algorithm: Optional[Callable[["Case"], Optional["ModuleType"]]] = None
    """``parallel_algorithm(case) -> module | None``: the backend's own CP/TP split (a module
    with ``forward`` and ``backward`` like :mod:`attnbench.parallel.ring`) for ``case``, or None
    for ours; read by :func:`attnbench.execution.multi.algorithm` (a library with its own CP,
    or a selftest mutant of ours)."""

    compile_report: Optional[Callable[[], Optional[dict]]] = None
    """``compile_report() -> dict | None``: what the backend compiled (``torch.compile``, a JIT)
    since it was last asked -- ``{"mode", "seconds", "kernels", "note"}`` -- asked once per
    case by the single-device runner (:mod:`attnbench.execution.single`), which makes it the
    record's ``compile`` section. The compile happens in the case's first (accuracy) call,
    before anything is timed; declaring it keeps its seconds apart and visible. Not declared:
    no section (ours come from Triton's hooks, :mod:`attnbench.execution.kernel_settings`)."""

    @classmethod
    def of(cls, backend: Any) -> "Capabilities":
        """What ``backend`` declares, read as the harness always has: a flag counts when its
        value is true, a hook when it is callable (``keep_mask`` as it is, None when absent)."""
        def hook(name: str) -> Optional[Callable]:
            value = getattr(backend, name, None)
            return value if callable(value) else None

        def flag(name: str) -> bool:
            return bool(getattr(backend, name, False))

        return cls(keep_mask=getattr(backend, "keep_mask", None),
                   input_precision=hook("input_precision"),
                   deterministic=flag("deterministic"),
                   supports_packed=flag("supports_packed"),
                   supports_packed_chunks=flag("supports_packed_chunks"),
                   supports_fp8=flag("supports_fp8"),
                   paged_kv=flag("paged_kv"),
                   backward_from_stats=hook("backward_from_stats"),
                   parallel_algorithm=hook("parallel_algorithm"),
                   compile_report=hook("compile_report"))


@dataclass(frozen=True, slots=True)
class World:
    """The ranks a multi-rank case runs on, as :func:`refusal` needs them. Filled by the CP/TP
    runner (:mod:`attnbench.execution.multi`), which knows the algorithms of
    :mod:`attnbench.parallel`; that package sits above this one, so its findings come in as
    values."""

    cp: int
    tp: int
    ring: bool = False
    """Whether the split that runs this backend is our ring or zigzag CP
    (:mod:`attnbench.parallel.ring`, not one the backend brings as ``parallel_algorithm``):
    every block's gradients are then recomputed from the merged statistics."""


def refusal(backend: Any, case: "Case", device: "torch.device",
            world: Optional[World] = None) -> Optional[str]:
    """Why ``backend`` cannot run ``case`` on ``device`` -- on the ranks ``world`` for a CP/TP
    case, None for one device -- or None when it may. The first reason wins, in this order:

    1. packed case, no ``supports_packed``;
    2. fp8 case, no ``supports_fp8`` (fp8 cases run on one device);
    3. the backend's own ``supports(case, device)``;
    4. paged case, no ``paged_kv`` (decode cases run on one device);
    5. with a ``world``: packed case split by CP, no ``supports_packed_chunks``;
    6. with a ``world`` whose split is our ring/zigzag: no ``backward_from_stats`` (and the
       case runs backward).

    What is not here: a split the case's heads or lengths do not allow
    (:func:`attnbench.parallel.layout.unsupported_reason`, a fact of the case and the ranks that
    the CP/TP runner settles before it loads the backend), a backend that returns no log-sum-exp
    (seen on the first ring block), and ``Unsupported`` raised by a backend as it runs."""
    caps = Capabilities.of(backend)
    reason = (_packed(caps, case) or _fp8(caps, case) or backend.supports(case, device)
              or _paged(caps, case))
    if reason or world is None:
        return reason
    return _packed_chunks(caps, case, world) or _ring(caps, backend, case, world)


def _packed(caps: Capabilities, case: "Case") -> Optional[str]:
    if case.is_packed and not caps.supports_packed:
        return (f"backend {case.backend!r} does not declare packed (variable-length) support "
                "(supports_packed = True; see attnbench/problem/packing.py)")
    return None


def _fp8(caps: Capabilities, case: "Case") -> Optional[str]:
    if is_fp8(case.dtype) and not caps.supports_fp8:
        return f"{case.backend} has no fp8 path (it does not declare supports_fp8)"
    return None


def _paged(caps: Capabilities, case: "Case") -> Optional[str]:
    if case.page_size and not caps.paged_kv:
        return f"{case.backend} reads a contiguous KV cache only (no paged_kv)"
    return None


def _packed_chunks(caps: Capabilities, case: "Case", world: World) -> Optional[str]:
    if case.is_packed and world.cp > 1 and not caps.supports_packed_chunks:
        return (f"packed CP: backend {case.backend!r} does not declare that it places chunks "
                "of packed sequences (supports_packed_chunks = True; AttnSpec.seq_q_start and "
                "seqlens_q_total, see attnbench.parallel.layout)")
    return None


def _ring(caps: Capabilities, backend: Any, case: "Case", world: World) -> Optional[str]:
    # A forward-only case (backward: false) merges the blocks' outputs and never recomputes a
    # block's gradients: it needs no backward_from_stats.
    if world.ring and case.backward and caps.backward_from_stats is None:
        return (f"ring/zigzag CP: backend {backend.name!r} has no backward_from_stats(q, k, v, "
                "out, lse, dout, spec) to recompute a block's gradients from the merged softmax "
                "statistics (see attnbench.backends.base); cp_algo: allgather needs none")
    return None
