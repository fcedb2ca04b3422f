"""Bugs in what a backend hands back rather than in what it computes: an output in the wrong
dtype, GQA gradients with the query's head count (both breaches of the backend contract,
:mod:`attnbench.accuracy.contract`: the backend's ``error``), and a log-sum-exp that is not the
natural log of the scaled scores' sum of exponentials, row for row (the ``lse`` check,
:mod:`attnbench.accuracy.lse_check`).

Each edits ``naive`` (dense, packed and decode calls), whose output and gradients stay right:
the lse mutants are wrong only in ``Forward.lse``, which a forward-only call's consumer (a ring
merge, a flash-decoding combine, a backward recomputing P) trusts and nothing else checks.
"""

from __future__ import annotations

from attnbench.backends.base import Forward
from attnbench.backends.naive import NaiveBackend
from attnbench.mutants.patch import mutated

_LSE = "lse = torch.logsumexp(scores.detach().float(), dim=-1)"
"""The line of naive's ``attend`` that the lse mutants edit."""


class OutFp32(NaiveBackend):
    """The fp32 accumulator written out without the cast to the input dtype
    (lucidrains/flash-attention-jax#13: float32 returned whatever the input dtype;
    facebookresearch/xformers#772: bf16 in, float32 out). Its values are more accurate than a
    bf16 output's, and were judged against bf16 bounds: it passed."""

    name = "mutant.out_fp32"

    def forward(self, q, k, v, spec):
        fwd = super().forward(q, k, v, spec)
        return Forward(out=fwd.out.float(), lse=fwd.lse, ctx=fwd.ctx)  # BUG: no cast back


class GqaDkvExpanded(NaiveBackend):
    """GQA/MQA dK/dV left per query head: K/V broadcast over the group in forward, and the
    backward's sum over the group (the "un-broadcast") skipped (marin-community/levanter#449,
    FA backward with GQA; NVIDIA/cudnn-frontend#493 writes dK/dV per query head and sums them in a
    separate reduction kernel). The gradients per query head are right; their shape is the
    query's (B, Hq, Sk, D), not k's (B, Hkv, Sk, D)."""

    name = "mutant.gqa_dkv_expanded"

    def forward(self, q, k, v, spec):
        fwd = super().forward(q, k, v, spec)
        return Forward(out=fwd.out, lse=fwd.lse, ctx=(fwd.ctx, q, k, v, spec))

    def backward(self, ctx, dout):
        inner, q, k, v, spec = ctx
        group = q.shape[1] // k.shape[1]
        if group == 1:
            return super().backward(inner, dout)
        wide = super().forward(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                               spec)
        return super().backward(wide.ctx, dout)  # BUG: dK/dV of the broadcast K/V, not summed


class LseBase2(NaiveBackend):
    """Forward's lse returned in base 2, as an exp2 kernel keeps it (m log2 e + log2 l),
    where callers expect natural log (lightseekorg/tokenspeed#571: gluon prefill stored a
    base-2 LSE; flashinfer-ai/flashinfer#2114 added ``return_lse_base_on_e``). Unlike
    ``mutant.lse_log2`` no backward of its own reads it: only the lse check sees it."""

    name = "mutant.lse_base2"
    attend = mutated(NaiveBackend.attend, _LSE,
                     _LSE + " * 1.4426950408889634  # BUG: log2, not ln")


class LseNoScale(NaiveBackend):
    """The lse of the scores before the softmax scale (log sum exp(q.k), not of scale * q.k):
    the kernel's own score units stored as the lse (ROCm/aiter#3349: the smoothed kernel's
    lse was off by its own score offset, breaking every FA-style merge;
    Dao-AILab/flash-attention#1884: the statistic kept as lse / scale)."""

    name = "mutant.lse_no_scale"
    attend = mutated(NaiveBackend.attend, _LSE,
                     "lse = torch.logsumexp(scores.detach().float() / spec.scale, dim=-1)"
                     "  # BUG: unscaled")


class LseRowsShifted(NaiveBackend):
    """Each row's lse written to the next row (a write-back index one row off:
    AMD-Ecosystem/flashinfer#42, the LSE of the wrong query row; Dao-AILab/flash-attention#2842,
    an early exit writing the lse to another slot). Every value is some row's correct lse."""

    name = "mutant.lse_rows_shifted"
    attend = mutated(NaiveBackend.attend, _LSE,
                     "lse = torch.roll(torch.logsumexp(scores.detach().float(), dim=-1), 1, -1)"
                     "  # BUG: one row off")
