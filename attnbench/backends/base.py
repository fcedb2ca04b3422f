"""The small protocol every attention implementation is measured through.

Legend: B = batch, Hq / Hkv = query / key-value heads, Sq / Sk = lengths, D / Dv = head dims.
q: (B, Hq, Sq, D), k: (B, Hkv, Sk, D), v: (B, Hkv, Sk, Dv), out and dout: (B, Hq, Sq, Dv),
all in the case's dtype on the case's device. Semantics (masks, ALiBi, softcap, dropout, GQA
head mapping, alignment) are fixed by :mod:`attnbench.problem.attn_spec`.

A backend::

    class MyBackend:
        name = "mine"
        keep_mask = None            # or a KeepMaskFn rebuilding the exact dropout mask it used

        def supports(self, case, device) -> str | None: ...   # None, or why it cannot run
        def forward(self, q, k, v, spec) -> Forward: ...
        def backward(self, ctx, dout) -> tuple[dq, dk, dv]: ...

``backward`` must use the dropout mask of the ``forward`` that made ``ctx`` and may be called
several times on one ``ctx`` (the timer does). What ``forward`` derives from the case (masks,
bias, tables) should be built once per case, not per call (:mod:`attnbench.backends.masks`):
every call is timed. A backend that finds at run time that it cannot handle a case raises
:class:`Unsupported`.

Optional, for the accuracy rule (:mod:`attnbench.accuracy.bounds`)::

        def input_precision(self, case, device) -> tuple[str, ...]: ...

the tensors (of out, dq, dk, dv) this backend computes or accumulates in the input dtype by
design; they are judged against the naive baseline, every other tensor against the fused
baseline (fp32 accumulation). A backend that does not declare it is a fused kernel.

Optional, for ring context parallelism (:mod:`attnbench.parallel.ring`)::

        def backward_from_stats(self, q, k, v, out, lse, dout, spec) -> tuple[dq, dk, dv]: ...

the gradients of one block of a larger softmax, recomputed from that softmax's *final* output
and log-sum-exp (P = exp(scores - lse), delta = rowsum(dout * out)), for the keys of this call
only. ``out`` (B, Hq, Sq, Dv) is in the input dtype, ``lse`` (B, Hq, Sq) float32 (-inf for rows
that see no key at all); the dropout mask is the one ``spec`` gives (its seed and global
offsets), so a caller that replays forward's ``spec`` replays forward's mask. Gradients come
back in the input dtype or wider; callers sum blocks in float32. Ring and zigzag CP need this and
a ``Forward.lse``; a backend without them is ``unsupported`` there (all-gather CP and TP need
neither).

Optional, for CP of packed cases (:mod:`attnbench.parallel.layout`)::

        supports_packed_chunks = True

declares that a packed call whose sequences are chunks of longer ones is understood: sequence
b's queries sit at ``spec.seq_q_start[b]`` of its ``spec.seqlens_q_total[b]`` positions (keys
likewise), as a dense call's sit at ``q_start`` of ``seqlen_q_total``. A backend that reads only
``cu_seqlens`` would align each chunk as a whole sequence and be wrong, never fail: without the
declaration packed CP is ``unsupported``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from attnbench.problem.attn_spec import AttnSpec, KeepMaskFn
    from attnbench.sweep.case import Case


class Unsupported(Exception):
    """Raised by a backend for a case it cannot run; the case is recorded as ``unsupported``."""


@dataclass
class Forward:
    out: "torch.Tensor"
    """(B, Hq, Sq, Dv) in the input dtype."""
    lse: Optional["torch.Tensor"]
    """(B, Hq, Sq) float32 natural-log log-sum-exp of the final (scaled, capped, biased, masked)
    scores, -inf for rows that see no key; None if the backend does not expose it."""
    ctx: Any
    """Whatever backward needs."""


@runtime_checkable
class Backend(Protocol):
    name: str
    keep_mask: Optional["KeepMaskFn"]

    def supports(self, case: "Case", device: "torch.device") -> Optional[str]: ...

    def forward(self, q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor",
                spec: "AttnSpec") -> Forward: ...

    def backward(self, ctx: Any, dout: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor",
                                                                 "torch.Tensor"]: ...


