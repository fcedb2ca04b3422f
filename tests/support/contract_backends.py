"""Tiny backends that break the backend contract (docs/backends.md), and one that keeps it with
non-contiguous tensors: attnbench must blame the first on the backend, in one line, before
judging, and pass the last."""

import torch

from attnbench.backends.base import Forward
from attnbench.backends.naive import NaiveBackend


class OutFloat32(NaiveBackend):
    """Returns its output in float32 whatever the case's dtype."""

    name = "out_float32"

    def forward(self, q, k, v, spec):
        fwd = super().forward(q, k, v, spec)
        return Forward(out=fwd.out.float(), lse=fwd.lse, ctx=fwd.ctx)


class DkvQueryHeads(NaiveBackend):
    """Returns dK/dV repeated to the query's head count (GQA's group sum left out)."""

    name = "dkv_query_heads"

    def backward(self, ctx, dout):
        dq, dk, dv = super().backward(ctx, dout)
        group = dq.shape[1] // dk.shape[1]
        return dq, dk.repeat_interleave(group, 1), dv.repeat_interleave(group, 1)


class LseWithHeadDim(NaiveBackend):
    """Returns its lse with a trailing unit dimension, (B, Hq, Sq, 1)."""

    name = "lse_with_head_dim"

    def forward(self, q, k, v, spec):
        fwd = super().forward(q, k, v, spec)
        return Forward(out=fwd.out, lse=fwd.lse.unsqueeze(-1), ctx=fwd.ctx)


class TwoGradients(NaiveBackend):
    """backward returns (dq, dk) only."""

    name = "two_gradients"

    def backward(self, ctx, dout):
        return super().backward(ctx, dout)[:2]


def _strided(x: torch.Tensor) -> torch.Tensor:
    """The same values, laid out (B, S, H, D) underneath: a non-contiguous (B, H, S, D) view."""
    return x.transpose(1, 2).contiguous().transpose(1, 2)


class NonContiguous(NaiveBackend):
    """Correct, with out, lse and every gradient non-contiguous views (a BSHD kernel's
    tensors seen as BHSD): strides are not part of the contract."""

    name = "non_contiguous"

    def forward(self, q, k, v, spec):
        fwd = super().forward(q, k, v, spec)
        lse = fwd.lse.transpose(1, 2).contiguous().transpose(1, 2)
        out = _strided(fwd.out)
        assert not out.is_contiguous() or out.shape[1] == 1
        return Forward(out=out, lse=lse, ctx=fwd.ctx)

    def backward(self, ctx, dout):
        return tuple(_strided(g) for g in super().backward(ctx, dout))
