"""Adapters for third-party fused attention: flash-attn, TransformerEngine, xformers.

Each imports its package only when asked and reports a missing package, or a feature it does
not map, through ``supports`` -> the case is recorded ``unsupported`` with the reason. None of
them exposes its dropout mask, so with dropout the reference-free identities decide.

Layouts: attnbench passes (B, H, S, D); flash-attn and TransformerEngine ("bshd") take
(B, S, H, D), xformers (B, S, H, D) too. Conventions line up with attnbench's: flash-attn's
``window_size=(left, right)``, bottom-right causal alignment and ALiBi bias
``-slope * |i + Sk - Sq - j|`` are exactly attnbench's (see problem.py).

These adapters have not been run here (no GPU, packages absent); they are written against the
packages' documented APIs.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Optional

import torch

from attnbench.backends.base import Forward
from attnbench.backends.masks import PreparesOnce, call_key, dense_masks
from attnbench.problem.packing import cu_tensor, from_thd, to_thd
from attnbench.problem.paged import decode_cache, decode_queries, packed_like


def _missing(module: str) -> Optional[str]:
    try:
        importlib.import_module(module)
    except Exception as exc:  # ImportError, or a broken CUDA extension raising at import
        return f"{module} is not importable here ({type(exc).__name__}: {str(exc)[:100]})"
    return None


def _alibi_slopes(spec, q: torch.Tensor) -> Optional[torch.Tensor]:
    """fp32 slopes of this call's query heads (None without ALiBi)."""
    if spec.alibi_slopes is None:
        return None
    heads = range(spec.head_start, spec.head_start + q.shape[1])
    return torch.tensor([spec.alibi_slopes[h] for h in heads], dtype=torch.float32,
                        device=q.device)


def _xformers_bias(spec, q: torch.Tensor, k: torch.Tensor):
    """xformers' attn_bias for one call: its bottom-right causal mask where it applies, else a
    dense (B, Hq, Sq, Sk) bias with -inf where keys are masked (ALiBi, windows)."""
    import xformers.ops as xops

    batch, heads_q, sq, _ = q.shape
    sk = k.shape[2]
    diag = spec.q_start + spec.diagonal_offset - spec.kv_start
    if spec.alibi_slopes is None and spec.is_causal and diag == sk - sq:
        return xops.fmha.attn_bias.LowerTriangularFromBottomRightMask()
    if spec.alibi_slopes is None and not spec.is_masked:
        return None
    bias, visible, _ = dense_masks(spec, batch, heads_q, sq, sk, q.dtype, q.device, keep=False)
    dense = bias if bias is not None else torch.zeros(heads_q, sq, sk, dtype=q.dtype,
                                                      device=q.device)
    if visible is not None:
        dense = dense.masked_fill(~visible, float("-inf"))
    return dense.unsqueeze(0).expand(batch, -1, -1, -1)


def _autograd_backward(ctx, dout):
    out, q_in, k_in, v_in = ctx
    return torch.autograd.grad(out, (q_in, k_in, v_in), dout, retain_graph=True)


FA2_PAGE_MULTIPLE = 256
"""flash-attn 2's paged cache: ``page_block_size must be a multiple of 256`` (flash_api.cpp)."""


class FlashAttnBackend(PreparesOnce):
    """flash-attn 2 (``flash_attn.flash_attn_func``; packed cases ``flash_attn_varlen_func``
    with the pack's ``cu_seqlens``, whose masks, ALiBi and bottom-right alignment are per
    sequence as in :mod:`attnbench.problem.packing`; decode cases ``flash_attn_with_kvcache``,
    contiguous or paged through ``block_table``, one cache length per sequence)."""

    name = "flash_attn"
    keep_mask = None
    supports_packed = True
    paged_kv = True

    def supports(self, case, device):
        if device.type != "cuda":
            return "flash_attn runs only on CUDA devices"
        if case.dtype == "fp32":
            return "flash_attn supports fp16 and bf16 only"
        if case.is_packed and case.dropout:
            return ("packed case with dropout: flash_attn hides its mask and the probe that "
                    "reads it back is for dense calls only")
        if case.page_size % FA2_PAGE_MULTIPLE:
            return (f"flash_attn_with_kvcache (flash-attn 2) takes pages of a multiple of "
                    f"{FA2_PAGE_MULTIPLE} tokens, not page_size {case.page_size}")
        return _missing("flash_attn")

    def decode(self, q, k, v, spec):
        """``flash_attn_with_kvcache`` on the cache of :func:`attnbench.problem.paged.decode_cache`:
        the pool (P, T, Hkv, D) with ``block_table``, or the contiguous cache as (B, Sk, Hkv, D)
        (made contiguous once, before timing); ``cache_seqlens`` gives each sequence's length,
        so flash-attn aligns the queries bottom-right at the end of it, as attnbench does."""
        from flash_attn import flash_attn_with_kvcache

        def build():
            cache = decode_cache(spec, k, v)
            if cache.block_table is None:
                cache = dataclasses.replace(cache, k=cache.k.transpose(1, 2).contiguous(),
                                            v=cache.v.transpose(1, 2).contiguous())
            return cache, _alibi_slopes(spec, q)

        cache, slopes = self.prepared.get(call_key(spec, q, k, "kvcache"), build)
        out, lse = flash_attn_with_kvcache(
            decode_queries(q, spec).transpose(1, 2), cache.k, cache.v,
            cache_seqlens=cache.seqlens, block_table=cache.block_table, softmax_scale=spec.scale,
            causal=False, window_size=(spec.window_left, spec.window_right),
            softcap=spec.softcap, alibi_slopes=slopes, return_softmax_lse=True)
        out, lse = packed_like(out.transpose(1, 2), lse.float(), spec)
        return Forward(out=out, lse=lse, ctx=None)

    def forward(self, q, k, v, spec):
        if spec.decode:
            return self.decode(q, k, v, spec)
        if spec.is_packed:
            return self._varlen_forward(q, k, v, spec)
        from flash_attn import flash_attn_func

        q_in, k_in, v_in = (t.detach().requires_grad_(True) for t in (q, k, v))
        # The log-sum-exp comes back only with return_attn_probs, which with dropout also makes
        # the kernel write the whole S x S probability matrix inside the timed call: ask for it
        # only without dropout (FA2 returns no matrix then: return_softmax and dropout_p > 0).
        with_lse = spec.dropout_p == 0
        with torch.enable_grad():
            result = flash_attn_func(
                q_in.transpose(1, 2), k_in.transpose(1, 2), v_in.transpose(1, 2),
                dropout_p=spec.dropout_p, softmax_scale=spec.scale, causal=False,
                window_size=(spec.window_left, spec.window_right), softcap=spec.softcap,
                alibi_slopes=self.prepared.get(call_key(spec, q, k),
                                               lambda: _alibi_slopes(spec, q)),
                return_attn_probs=with_lse)
            out, lse = (result[0], result[1].float()) if with_lse else (result, None)
            out = out.transpose(1, 2)
        return Forward(out=out.detach(), lse=lse, ctx=(out, q_in, k_in, v_in))

    def _varlen_forward(self, q, k, v, spec):
        """One ``flash_attn_varlen_func`` call on the pack: (1, H, T, D) -> (T, H, D). The
        offsets (int32 on the device) and the longest lengths are built once per case."""
        from flash_attn import flash_attn_varlen_func

        cu_q, cu_k, max_q, max_k = self.prepared.get(
            ("varlen", spec.cu_seqlens_q, spec.cu_seqlens_kv, str(q.device)),
            lambda: (cu_tensor(spec.cu_seqlens_q, q.device),
                     cu_tensor(spec.cu_seqlens_kv, q.device),
                     max(b - a for a, b in zip(spec.cu_seqlens_q, spec.cu_seqlens_q[1:])),
                     max(b - a for a, b in zip(spec.cu_seqlens_kv, spec.cu_seqlens_kv[1:]))))
        q_in, k_in, v_in = (t.detach().requires_grad_(True) for t in (q, k, v))
        with torch.enable_grad():
            result = flash_attn_varlen_func(
                to_thd(q_in), to_thd(k_in), to_thd(v_in), cu_q, cu_k, max_q, max_k,
                dropout_p=spec.dropout_p, softmax_scale=spec.scale, causal=False,
                window_size=(spec.window_left, spec.window_right), softcap=spec.softcap,
                alibi_slopes=self.prepared.get(call_key(spec, q, k),
                                               lambda: _alibi_slopes(spec, q)),
                return_attn_probs=True)
            out = from_thd(result[0])
        lse = result[1].float()
        # FA2 >= 2.4 returns lse as (H, Tq); older ones padded per sequence: not comparable.
        lse = lse.unsqueeze(0) if lse.shape == (q.shape[1], q.shape[2]) else None
        return Forward(out=out.detach(), lse=lse, ctx=(out, q_in, k_in, v_in))

    backward = staticmethod(_autograd_backward)


class TransformerEngineBackend(PreparesOnce):
    """TransformerEngine ``DotProductAttention`` (qkv_format="bshd")."""

    name = "transformer_engine"
    keep_mask = None

    def __init__(self):
        self._modules: dict = {}

    def supports(self, case, device):
        if device.type != "cuda":
            return "transformer_engine runs only on CUDA devices"
        if case.softcap:
            return "transformer_engine DotProductAttention has no softcap"
        return _missing("transformer_engine.pytorch")

    def _module(self, heads_q, heads_kv, head_dim, spec, device):
        import transformer_engine.pytorch as te

        if spec.window_left < 0 and spec.window_right < 0:
            mask_type, window = "no_mask", None
        elif spec.is_causal:
            mask_type, window = "causal_bottom_right", None
        else:
            mask_type, window = "no_mask", (spec.window_left, spec.window_right)
        key = (heads_q, heads_kv, head_dim, spec.dropout_p, mask_type, window, spec.scale)
        if key not in self._modules:
            self._modules[key] = te.DotProductAttention(
                heads_q, head_dim, num_gqa_groups=heads_kv, attention_dropout=spec.dropout_p,
                qkv_format="bshd", attn_mask_type=mask_type, window_size=window,
                softmax_scale=spec.scale).to(device)
        return self._modules[key]

    def forward(self, q, k, v, spec):
        module = self._module(q.shape[1], k.shape[1], q.shape[-1], spec, q.device)
        q_in, k_in, v_in = (t.detach().requires_grad_(True) for t in (q, k, v))
        extra = {}
        if spec.alibi_slopes is not None:
            extra = {"core_attention_bias_type": "alibi",
                     "alibi_slopes": self.prepared.get(call_key(spec, q, k),
                                                       lambda: _alibi_slopes(spec, q))}
        with torch.enable_grad():
            out = module(q_in.transpose(1, 2), k_in.transpose(1, 2), v_in.transpose(1, 2),
                         **extra)
            # bshd output is (B, S, H * Dv)
            out = out.view(q.shape[0], q.shape[2], q.shape[1], -1).transpose(1, 2)
        return Forward(out=out.detach(), lse=None, ctx=(out, q_in, k_in, v_in))

    backward = staticmethod(_autograd_backward)


class XformersBackend(PreparesOnce):
    """xformers ``memory_efficient_attention`` with an explicit bias tensor for ALiBi and
    windows, and its bottom-right causal mask."""

    name = "xformers"
    keep_mask = None

    def supports(self, case, device):
        if case.softcap:
            return "xformers memory_efficient_attention has no softcap"
        return _missing("xformers.ops")

    def forward(self, q, k, v, spec):
        import xformers.ops as xops

        batch, heads_q, sq, _ = q.shape
        heads_kv = k.shape[1]
        attn_bias = self.prepared.get(call_key(spec, q, k), lambda: _xformers_bias(spec, q, k))
        q_in, k_in, v_in = (t.detach().requires_grad_(True) for t in (q, k, v))
        group = heads_q // heads_kv
        with torch.enable_grad():
            k_rep = k_in.repeat_interleave(group, dim=1) if group > 1 else k_in
            v_rep = v_in.repeat_interleave(group, dim=1) if group > 1 else v_in
            out = xops.memory_efficient_attention(
                q_in.transpose(1, 2), k_rep.transpose(1, 2), v_rep.transpose(1, 2),
                attn_bias=attn_bias, p=spec.dropout_p, scale=spec.scale).transpose(1, 2)
        return Forward(out=out.detach(), lse=None, ctx=(out, q_in, k_in, v_in))

    backward = staticmethod(_autograd_backward)
