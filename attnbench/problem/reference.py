"""Exact attention in float64: the specification every backend is measured against.

Legend: B = batch, Hkv = key-value heads, G = query heads per kv head (Hq = Hkv * G),
Sq / Sk = lengths, D / Dv = head dims, bq / bk = block lengths.

Chunked over query and key blocks with an online softmax, so memory is O(S * D) plus one block of
scores: at S = 16384, 1 head, D = 64 the full S x S fp64 matrix alone would be 2 GiB; here a block
is at most ``_BLOCK_ELEMS`` doubles. The backward is the explicit flash-attention backward
(recompute P from the saved log-sum-exp), also in blocks. GQA/MQA never repeats K/V: queries are
viewed as (B, Hkv, G, Sq, D) and broadcast against (B, Hkv, 1, Sk, D).

Dropout uses an explicit keep-mask provider (see :mod:`attnbench.problem.attn_spec`), so the
reference applies exactly the mask a backend used, block by block.
"""

from __future__ import annotations

from typing import Optional

import torch

from attnbench.problem.attn_spec import AttnSpec, KeepMaskFn
from attnbench.problem.packing import backward_per_sequence, forward_per_sequence

# Scores in one block: 2^22 doubles = 32 MiB; with a handful of same-sized temporaries the
# reference stays far under 1 GiB whatever the sequence length.
_BLOCK_ELEMS = 1 << 22
F64 = torch.float64


def block_sizes(batch_heads: int, sq: int, sk: int) -> tuple[int, int]:
    """(query rows, keys) of one block: at most _BLOCK_ELEMS scores over all heads."""
    bk = max(1, min(sk, 1024))  # sk = 0: a packed CP chunk of no keys (no blocks)
    bq = max(1, min(sq, _BLOCK_ELEMS // max(1, batch_heads * bk)))
    return bq, bk


class ScoreBlocks:
    """Scores of one (query block, key block) pair, with everything the forward and backward
    both need recomputed in one place."""

    def __init__(self, spec: AttnSpec, batch: int, heads_kv: int, group: int, device,
                 keep_mask: Optional[KeepMaskFn]):
        self.spec = spec
        self.batch, self.heads_kv, self.group = batch, heads_kv, group
        self.heads = torch.arange(spec.head_start, spec.head_start + heads_kv * group, device=device)
        self.batches = torch.arange(spec.batch_start, spec.batch_start + batch, device=device)
        self.keep_mask = keep_mask if spec.dropout_p > 0 else None
        if spec.dropout_p > 0 and keep_mask is None:
            raise ValueError("dropout > 0 needs an explicit keep_mask provider for the reference")

    def any_visible(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> bool:
        # Skipping blocks wholly outside a causal or window band halves causal work.
        vis = self.spec.visible(q_pos, k_pos)
        return True if vis is None else bool(vis.any())

    def scores(self, q_blk: torch.Tensor, k_blk: torch.Tensor, q_pos: torch.Tensor,
               k_pos: torch.Tensor):
        """Return (scores, tanh_or_None, visible_or_None); scores (B, Hkv, G, bq, bk) with
        masked positions at -inf. tanh is kept for the softcap derivative."""
        spec = self.spec
        s, t = spec.score_block(torch.matmul(q_blk, k_blk.transpose(-1, -2)), self.heads, q_pos,
                                k_pos)
        vis = spec.visible(q_pos, k_pos)
        if vis is not None:
            s = s.masked_fill(~vis, float("-inf"))
        return s, t, vis

    def dropout_scale(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> Optional[torch.Tensor]:
        """keep / (1 - p) as (B, Hkv, G, bq, bk) float64, or None without dropout."""
        if self.keep_mask is None:
            return None
        keep = self.keep_mask(self.spec, self.batches, self.heads, q_pos, k_pos)
        keep = keep.to(F64) / (1.0 - self.spec.dropout_p)
        return keep.view(self.batch, self.heads_kv, self.group, *keep.shape[2:])


def grouped_f64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """q as (B, Hkv, G, Sq, D), k and v as (B, Hkv, 1, Sk, *), all float64, and B, Hkv, G."""
    batch, heads_q, _, _ = q.shape
    heads_kv = k.shape[1]
    if heads_q % heads_kv:
        raise ValueError(f"heads_q={heads_q} is not a multiple of heads_kv={heads_kv}")
    group = heads_q // heads_kv
    q5 = q.to(F64).view(batch, heads_kv, group, q.shape[2], q.shape[3])
    k5 = k.to(F64).unsqueeze(2)
    v5 = v.to(F64).unsqueeze(2)
    return q5, k5, v5, batch, heads_kv, group


@torch.no_grad()
def reference_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttnSpec,
                      keep_mask: Optional[KeepMaskFn] = None):
    """fp64 attention. Returns (out (B, Hq, Sq, Dv), lse (B, Hq, Sq)), both float64. A packed
    ``spec``: each sequence on its own (:mod:`attnbench.problem.packing`)."""
    if spec.is_packed:
        return forward_per_sequence(reference_forward, q, k, v, spec, keep_mask=keep_mask)
    q5, k5, v5, batch, heads_kv, group = grouped_f64(q, k, v)
    sq, sk, dv = q5.shape[3], k5.shape[3], v5.shape[-1]
    blocks = ScoreBlocks(spec, batch, heads_kv, group, q.device, keep_mask)
    bq, bk = block_sizes(batch * heads_kv * group, sq, sk)
    out = torch.zeros(batch, heads_kv, group, sq, dv, dtype=F64, device=q.device)
    lse = torch.full((batch, heads_kv, group, sq), float("-inf"), dtype=F64, device=q.device)
    for i0 in range(0, sq, bq):
        i1 = min(sq, i0 + bq)
        q_pos = torch.arange(spec.q_start + i0, spec.q_start + i1, device=q.device)
        running_max = torch.full((batch, heads_kv, group, i1 - i0), float("-inf"), dtype=F64,
                                 device=q.device)
        denom = torch.zeros_like(running_max)
        acc = torch.zeros(batch, heads_kv, group, i1 - i0, dv, dtype=F64, device=q.device)
        for j0 in range(0, sk, bk):
            j1 = min(sk, j0 + bk)
            k_pos = torch.arange(spec.kv_start + j0, spec.kv_start + j1, device=q.device)
            if not blocks.any_visible(q_pos, k_pos):
                continue
            s, _, _ = blocks.scores(q5[:, :, :, i0:i1], k5[:, :, :, j0:j1], q_pos, k_pos)
            new_max = torch.maximum(running_max, s.amax(-1))
            safe_max = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
            p = torch.exp(s - safe_max[..., None])
            correction = torch.exp(running_max - safe_max)
            denom = denom * correction + p.sum(-1)  # the softmax normaliser ignores dropout
            drop = blocks.dropout_scale(q_pos, k_pos)
            if drop is not None:
                p = p * drop
            acc = acc * correction[..., None] + torch.matmul(p, v5[:, :, :, j0:j1])
            running_max = new_max
        seen = denom > 0
        out[:, :, :, i0:i1] = torch.where(seen[..., None], acc / denom.clamp_min(1e-300)[..., None],
                                          torch.zeros_like(acc))
        lse[:, :, :, i0:i1] = torch.where(seen, running_max + torch.log(denom.clamp_min(1e-300)),
                                          torch.full_like(denom, float("-inf")))
    return out.view(batch, heads_kv * group, sq, dv), lse.view(batch, heads_kv * group, sq)


@torch.no_grad()
def reference_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor, dout: torch.Tensor, spec: AttnSpec,
                       keep_mask: Optional[KeepMaskFn] = None):
    """fp64 gradients (dq, dk, dv) of sum(out * dout), given forward's out and lse.

    dS = P * (dP - rowsum(dO * O)) where dP = (dO @ V^T) * keep / (1 - p); with softcap,
    dS_raw = dS * (1 - tanh^2). GQA: dK/dV of a kv head sum over its query-head group.
    """
    if spec.is_packed:
        return backward_per_sequence(reference_backward, q, k, v, out, lse, dout, spec,
                                     keep_mask=keep_mask)
    q5, k5, v5, batch, heads_kv, group = grouped_f64(q, k, v)
    sq, sk, d = q5.shape[3], k5.shape[3], q5.shape[-1]
    dout5 = dout.to(F64).view(batch, heads_kv, group, sq, dout.shape[-1])  # sq may be 0
    out5 = out.to(F64).view(batch, heads_kv, group, sq, out.shape[-1])
    lse5 = lse.to(F64).view(batch, heads_kv, group, sq)
    delta = (dout5 * out5).sum(-1)
    lse_safe = torch.where(torch.isinf(lse5), torch.zeros_like(lse5), lse5)
    blocks = ScoreBlocks(spec, batch, heads_kv, group, q.device, keep_mask)
    bq, bk = block_sizes(batch * heads_kv * group, sq, sk)
    dq = torch.zeros_like(q5)
    dk = torch.zeros(batch, heads_kv, sk, d, dtype=F64, device=q.device)
    dv = torch.zeros(batch, heads_kv, sk, v5.shape[-1], dtype=F64, device=q.device)
    for i0 in range(0, sq, bq):
        i1 = min(sq, i0 + bq)
        q_pos = torch.arange(spec.q_start + i0, spec.q_start + i1, device=q.device)
        q_blk = q5[:, :, :, i0:i1]
        do_blk = dout5[:, :, :, i0:i1]
        for j0 in range(0, sk, bk):
            j1 = min(sk, j0 + bk)
            k_pos = torch.arange(spec.kv_start + j0, spec.kv_start + j1, device=q.device)
            if not blocks.any_visible(q_pos, k_pos):
                continue
            k_blk, v_blk = k5[:, :, :, j0:j1], v5[:, :, :, j0:j1]
            s, t, _ = blocks.scores(q_blk, k_blk, q_pos, k_pos)
            p = torch.exp(s - lse_safe[:, :, :, i0:i1, None])  # masked (-inf) entries give 0
            drop = blocks.dropout_scale(q_pos, k_pos)
            p_dropped = p if drop is None else p * drop
            dv[:, :, j0:j1] += torch.matmul(p_dropped.transpose(-1, -2), do_blk).sum(2)
            dp = torch.matmul(do_blk, v_blk.transpose(-1, -2))
            if drop is not None:
                dp = dp * drop
            ds = p * (dp - delta[:, :, :, i0:i1, None])
            if t is not None:
                ds = ds * (1.0 - t * t)
            ds = ds * spec.scale
            dq[:, :, :, i0:i1] += torch.matmul(ds, k_blk)
            dk[:, :, j0:j1] += torch.matmul(ds.transpose(-1, -2), q_blk).sum(2)
    return dq.view(batch, heads_kv * group, sq, d), dk, dv
