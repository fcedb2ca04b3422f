"""``naive``: the textbook math in the case's dtype (Megatron's "local" attention).

Scores, bias and P @ V are in the case's dtype; softmax runs in fp32 and is cast back, as
Megatron does with --attention-softmax-in-fp32. K/V are repeated for GQA, the full S x S score
matrix is materialised, and autograd provides the backward. This is the baseline whose error
bounds what a fused kernel may lose (the flash-attn rule), so it must stay plain and obvious.
"""

from __future__ import annotations

import torch

from attnbench.backends.base import Forward
from attnbench.backends.masks import PreparesOnce, call_key, dense_masks
from attnbench.problem.dropout import hash_keep_mask
from attnbench.problem.fp8 import dequantize_call, output_dtype
from attnbench.problem.packing import backward_per_sequence, per_sequence
from attnbench.problem.paged import build_paged_cache, gather_kv
from attnbench.results.records import TENSORS


class NaiveBackend(PreparesOnce):
    name = "naive"
    keep_mask = staticmethod(hash_keep_mask)
    deterministic = True  # checked: repeated backward calls must agree bit for bit
    paged_kv = True  # decode: the cache is gathered from its pages through the block table
    supports_packed = True  # each sequence of a pack alone (attnbench.problem.packing)
    supports_fp8 = True  # the textbook math in bf16 on the dequantized values (exact in bf16)
    supports_packed_chunks = True  # packed CP: per sequence through packing.sequence_spec

    def supports(self, case, device):
        return None

    def input_precision(self, case, device):
        """Scores, P and P·V in the case's dtype: judged against itself as the naive baseline
        (the baseline of every input-precision backend)."""
        return TENSORS

    def masks(self, spec, q, k):
        """(bias, visible, keep) of a call with these q, k: built once, then reused."""
        return self.prepared.get(call_key(spec, q, k), lambda: self.build_masks(spec, q, k))

    def build_masks(self, spec, q, k):
        batch, heads_q, sq, _ = q.shape
        if spec.is_packed:  # one set per sequence, all built once for the pack
            return [dense_masks(sub, 1, heads_q, seg.len_q, seg.len_k, q.dtype, q.device)
                    for seg, sub in per_sequence(spec)]
        return dense_masks(spec, batch, heads_q, sq, k.shape[2], q.dtype, q.device)

    def dequantized(self, q, k, v, spec):
        """fp8 q, k, v times their descales, in the case's output dtype (exact for power-of-two
        descales)."""
        return dequantize_call(q, k, v, spec, output_dtype(spec.fp8_format))

    def cache_kv(self, spec, k, v):
        """(k, v) as the call reads them: a paged cache (decode, ``page_size``) gathered back
        into (B, Hkv, Sk, *) through its block table inside the call, as a plain paged
        implementation would."""
        if not spec.page_size:
            return k, v
        paged = self.prepared.get(call_key(spec, k, v, "paged"),
                                  lambda: build_paged_cache(k, v, spec.page_size,
                                                            seed=spec.dropout_seed,
                                                            cu_seqlens=spec.cu_seqlens_kv))
        return gather_kv(paged)

    def forward(self, q, k, v, spec):
        if spec.fp8_format:  # fp8 inputs: what an unfused bf16 model computes from them
            q, k, v = self.dequantized(q, k, v, spec)
        masks = self.masks(spec, q, k)
        k, v = self.cache_kv(spec, k, v)
        # Decode is forward only: no autograd state (it would be timed, and kept).
        q_in, k_in, v_in = (t.detach().requires_grad_(not spec.decode) for t in (q, k, v))
        with torch.set_grad_enabled(not spec.decode):
            if spec.is_packed:  # each sequence alone, then packed again (autograd follows)
                parts = [self.attend(q_in[:, :, seg.q0:seg.q1], k_in[:, :, seg.k0:seg.k1],
                                     v_in[:, :, seg.k0:seg.k1], sub, seq_masks)
                         for (seg, sub), seq_masks in zip(per_sequence(spec), masks)]
                out = torch.cat([o for o, _ in parts], 2)
                lse = torch.cat([lse for _, lse in parts], 2)
            else:
                out, lse = self.attend(q_in, k_in, v_in, spec, masks)
        return Forward(out=out.detach(), lse=lse, ctx=(out, q_in, k_in, v_in))

    def attend(self, q_in, k_in, v_in, spec, masks):
        """(out with its autograd graph, lse float32) of one dense call."""
        group = q_in.shape[1] // k_in.shape[1]
        bias, visible, keep = masks
        k_rep = k_in.repeat_interleave(group, dim=1)
        v_rep = v_in.repeat_interleave(group, dim=1)
        scores = torch.matmul(q_in, k_rep.transpose(-1, -2)) * spec.scale
        if spec.softcap > 0:
            scores = spec.softcap * torch.tanh(scores / spec.softcap)
        if bias is not None:
            scores = scores + bias
        row_seen = None
        if visible is not None:
            scores = scores.masked_fill(~visible, float("-inf"))
            row_seen = visible.any(-1, keepdim=True)
            # A row that sees no key would softmax to NaN (and NaN gradients); give it
            # finite scores here and zero its probabilities below.
            scores = scores.masked_fill(~row_seen, 0.0)
        # fp32 softmax for half types (Megatron's --attention-softmax-in-fp32); fp64 stays.
        probs = torch.softmax(scores.to(torch.promote_types(scores.dtype, torch.float32)),
                              dim=-1).to(q_in.dtype)
        if row_seen is not None:
            probs = probs * row_seen
        if keep is not None:
            probs = probs * (keep.to(q_in.dtype) / (1.0 - spec.dropout_p)).to(q_in.dtype)
        out = torch.matmul(probs, v_rep)
        with torch.no_grad():
            lse = torch.logsumexp(scores.detach().float(), dim=-1)
            if row_seen is not None:
                lse = lse.masked_fill(~row_seen.squeeze(-1), float("-inf"))
        return out, lse

    def backward(self, ctx, dout):
        out, q_in, k_in, v_in = ctx
        dq, dk, dv = torch.autograd.grad(out, (q_in, k_in, v_in), dout, retain_graph=True)
        return dq, dk, dv

    def backward_from_stats(self, q, k, v, out, lse, dout, spec):
        """Gradients of one block of a larger softmax (ring context parallelism), recomputed
        densely from that softmax's final ``out`` and ``lse`` with forward's precision choices:
        scores and matmuls in the case's dtype, exponentials and the softmax gradient in fp32.
        q: (B, Hq, Sq, D), k: (B, Hkv, Sk, D), v: (B, Hkv, Sk, Dv), out / dout: (B, Hq, Sq, Dv),
        lse: (B, Hq, Sq) float32. Returns dq (B, Hq, Sq, D), dk, dv (B, Hkv, Sk, *). A packed
        call (packed CP): each sequence alone."""
        if spec.is_packed:
            return backward_per_sequence(self.backward_from_stats, q, k, v, out, lse, dout, spec)
        batch, heads_q, sq, _ = q.shape
        heads_kv, sk = k.shape[1], k.shape[2]
        group = heads_q // heads_kv
        dtype = q.dtype
        wide = torch.promote_types(dtype, torch.float32)
        bias, visible, keep = self.masks(spec, q, k)
        k_rep = k.repeat_interleave(group, dim=1)
        v_rep = v.repeat_interleave(group, dim=1)
        scores = torch.matmul(q, k_rep.transpose(-1, -2)) * spec.scale
        tanh = None
        if spec.softcap > 0:
            tanh = torch.tanh(scores / spec.softcap)
            scores = spec.softcap * tanh
        if bias is not None:
            scores = scores + bias
        if visible is not None:
            scores = scores.masked_fill(~visible, float("-inf"))
        # A row that sees no key anywhere has lse -inf and only -inf scores: its P is 0.
        lse_safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse).to(wide)
        probs = torch.exp(scores.to(wide) - lse_safe[..., None])
        drop = None
        if keep is not None:
            drop = keep.to(wide) / (1.0 - spec.dropout_p)
        probs_dropped = (probs if drop is None else probs * drop).to(dtype)
        dv = torch.matmul(probs_dropped.transpose(-1, -2), dout)
        dp = torch.matmul(dout, v_rep.transpose(-1, -2)).to(wide)
        if drop is not None:
            dp = dp * drop
        delta = (dout.to(wide) * out.to(wide)).sum(-1, keepdim=True)
        ds = probs * (dp - delta)
        if tanh is not None:
            ds = ds * (1.0 - tanh.to(wide) ** 2)
        ds = (ds * spec.scale).to(dtype)
        dq = torch.matmul(ds, k_rep)
        dk = torch.matmul(ds.transpose(-1, -2), q)
        # GQA: a K/V head's gradient is the sum over its query-head group.
        dk = dk.view(batch, heads_kv, group, sk, k.shape[-1]).sum(2)  # sk may be 0
        dv = dv.view(batch, heads_kv, group, sk, v.shape[-1]).sum(2)
        return dq, dk, dv
