"""fp64 quantities of one attention call without dropout, for judging its hidden dropout mask.

Legend: B = batch, Hq / Hkv = query / key-value heads, Sq / Sk = lengths, Dv = value head dim;
P = softmax probabilities (B, Hq, Sq, Sk) without dropout. Computed from the fp64 reference's
own score blocks (softcap, ALiBi, windows and alignment stay defined once), a pack per
document. Used by :mod:`attnbench.accuracy.dropout_probe`.
"""

from __future__ import annotations

import functools
from typing import Iterator

import torch

from attnbench.problem.attn_spec import AttnSpec
from attnbench.problem.packing import per_sequence
from attnbench.problem.reference import ScoreBlocks, block_sizes, grouped_f64, reference_forward

F64 = torch.float64


class ExactCall:
    """fp64 attention of one call without dropout: output, log-sum-exp, P and the moments of P
    the statistics need, from the reference's own score blocks (O(S * D) memory, except
    :meth:`probabilities`, which is the whole of P)."""

    def __init__(self, q, k, v, spec: AttnSpec):
        self.q, self.k, self.v = q, k, v
        self.spec = spec.replace(dropout_p=0.0)

    @functools.cached_property
    def solution(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(out (B, Hq, Sq, Dv), lse (B, Hq, Sq)) without dropout."""
        return reference_forward(self.q, self.k, self.v, self.spec)

    def columns(self, keys: torch.Tensor) -> torch.Tensor:
        """P[..., keys] (B, Hq, Sq, len(keys)) fp64: the reference's output for V = identity
        columns, the same identity the probe uses."""
        like = self.v.new_zeros(*self.v.shape[:3], len(keys), dtype=F64)
        return reference_forward(self.q, self.k, identity_columns(like, keys), self.spec)[0]

    def probabilities(self) -> torch.Tensor:
        """All of P (B, Hq, Sq, Sk) fp64."""
        batch, heads_q, sq, _ = self.q.shape
        probs = torch.zeros(batch, heads_q, sq, self.k.shape[2], dtype=F64, device=self.q.device)
        for (i0, i1, j0, j1), p in self.blocks():
            probs[:, :, i0:i1, j0:j1] = p.flatten(1, 2)
        return probs

    def moments(self):
        """Per row sum_j P^2 and sum_j P^4 (B, Hq, Sq); per output element sum_j P^2 V^2
        (B, Hq, Sq, Dv): the variance of a correct dropout's row sums and outputs."""
        batch, heads_q, sq, _ = self.q.shape
        heads_kv, dv = self.v.shape[1], self.v.shape[-1]
        row_p2 = torch.zeros(batch, heads_kv, heads_q // heads_kv, sq, dtype=F64,
                             device=self.q.device)
        row_p4 = torch.zeros_like(row_p2)
        p2v2 = torch.zeros(*row_p2.shape, dv, dtype=F64, device=self.q.device)
        v_sq = (self.v.to(F64) ** 2).unsqueeze(2)
        for (i0, i1, j0, j1), p in self.blocks():
            p_sq = p * p
            row_p2[..., i0:i1] += p_sq.sum(-1)
            row_p4[..., i0:i1] += (p_sq * p_sq).sum(-1)
            p2v2[..., i0:i1, :] += torch.matmul(p_sq, v_sq[:, :, :, j0:j1])
        return (row_p2.view(batch, heads_q, sq), row_p4.view(batch, heads_q, sq),
                p2v2.view(batch, heads_q, sq, dv))

    def blocks(self) -> Iterator[tuple[tuple[int, int, int, int], torch.Tensor]]:
        """((i0, i1, j0, j1), P[i0:i1, j0:j1] as (B, Hkv, G, bq, bk)) for every block with a
        visible key; P = exp(scores - lse), 0 where masked. A pack: each document's blocks as
        a dense call of its own (:func:`attnbench.problem.packing.per_sequence`), placed at
        its rows and keys of the pack; blocks across documents are all 0 and never yielded."""
        if self.spec.is_packed:
            yield from self.document_blocks()
            return
        q5, k5, _, batch, heads_kv, group = grouped_f64(self.q, self.k, self.v)
        sq, sk = q5.shape[3], k5.shape[3]
        blocks = ScoreBlocks(self.spec, batch, heads_kv, group, self.q.device, None)
        bq, bk = block_sizes(batch * heads_kv * group, sq, sk)
        lse = self.solution[1].view(batch, heads_kv, group, sq)
        lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
        start_q, start_k, device = self.spec.q_start, self.spec.kv_start, self.q.device
        for i0 in range(0, sq, bq):
            i1 = min(sq, i0 + bq)
            q_pos = torch.arange(start_q + i0, start_q + i1, device=device)
            for j0 in range(0, sk, bk):
                j1 = min(sk, j0 + bk)
                k_pos = torch.arange(start_k + j0, start_k + j1, device=device)
                if not blocks.any_visible(q_pos, k_pos):
                    continue
                s, _, _ = blocks.scores(q5[:, :, :, i0:i1], k5[:, :, :, j0:j1], q_pos, k_pos)
                yield (i0, i1, j0, j1), torch.exp(s - lse[:, :, :, i0:i1, None])


    def document_blocks(self) -> Iterator[tuple[tuple[int, int, int, int], torch.Tensor]]:
        out, lse = self.solution
        for seg, sub in per_sequence(self.spec):
            rows, keys = slice(seg.q0, seg.q1), slice(seg.k0, seg.k1)
            part = ExactCall(self.q[:, :, rows], self.k[:, :, keys], self.v[:, :, keys], sub)
            part.__dict__["solution"] = (out[:, :, rows], lse[:, :, rows])  # computed once
            for (i0, i1, j0, j1), p in part.blocks():
                yield (i0 + seg.q0, i1 + seg.q0, j0 + seg.k0, j1 + seg.k0), p


def visible_floor(dtype: torch.dtype) -> float:
    """Smallest fp64 P whose kept entry cannot come out of the probe as 0: 16 x the dtype's
    smallest subnormal and fp32's smallest normal (a kernel may flush fp32 subnormals), room for
    a kernel's P to be 16 x too small. fp16: 9.5e-7; bf16 / fp32: 1.9e-37."""
    info = torch.finfo(dtype)
    return 16.0 * max(info.tiny * info.eps, torch.finfo(torch.float32).tiny)


def identity_columns(like: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Zeros like ``like`` (B, Hkv, Sk, Dv) with V[..., keys[c], c] = 1, c < len(keys) <= Dv;
    the remaining columns (the last chunk's padding) stay 0."""
    probe = torch.zeros_like(like)
    probe[:, :, keys, torch.arange(len(keys), device=like.device)] = 1
    return probe
