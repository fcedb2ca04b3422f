"""The correct code the single-device backward mutants edit.

:class:`RecomputingNaive` is ``naive`` with a fused kernel's backward: forward keeps only its
output and log-sum-exp, and backward recomputes the softmax from them
(:meth:`NaiveBackend.backward_from_stats` over the whole problem -- the same code ring CP runs
per block). It is correct, registered as ``mutant.base`` and run by ``attnbench selftest`` among
the backends that must pass, so a mutant built on it that fails does so because of its one edit.
"""

from __future__ import annotations

from attnbench.backends.base import Forward
from attnbench.backends.naive import NaiveBackend


class RecomputingNaive(NaiveBackend):
    """naive forward; backward recomputed from (out, lse) like a flash-attention kernel."""

    name = "mutant.base"
    supports_packed = False  # backward_from_stats is a dense (one-sequence) recomputation

    def forward(self, q, k, v, spec):
        fwd = super().forward(q, k, v, spec)
        return Forward(out=fwd.out, lse=fwd.lse, ctx=(q, k, v, fwd.out, fwd.lse, spec))

    def backward(self, ctx, dout):
        q, k, v, out, lse, spec = ctx
        dq, dk, dv = self.backward_from_stats(q, k, v, out, lse, dout, spec)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
