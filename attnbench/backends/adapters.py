"""Adapters for third-party fused attention: flash-attn 2 and xformers, and what the other
adapters (:mod:`attnbench.backends.flash_attn3`, :mod:`attnbench.backends.transformer_engine`)
share with them.

Each imports its package only when asked and reports a missing package, a feature it does not
map, or what the installed release rejects (:mod:`attnbench.backends.upstream`, with its
version) through ``supports`` -> the case is recorded ``unsupported`` with the reason. None of
them exposes its dropout mask, so with dropout the reference-free identities decide.

Layouts: attnbench passes (B, H, S, D); flash-attn and xformers take (B, S, H, D) and read
strides, so the transposed views go as they are. Conventions line up with attnbench's where the
call sits at its own bottom-right corner: flash-attn's ``window_size=(left, right)``,
bottom-right causal alignment and ALiBi bias ``-slope * |i + Sk - Sq - j|``; a call with global
offsets (all-gather CP) is moved there by :mod:`attnbench.backends.call_window`. xformers takes
the call's own diagonal through its bias.

These adapters have not been run here (no GPU, packages absent): they are written against the
packages' sources (flash_attn/flash_attn_interface.py and csrc/flash_attn/flash_api.cpp,
xformers/ops/fmha) and checked against stand-ins that assert what those sources assert
(tests/backends/test_adapters_upstream.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch

from attnbench.backends.base import Forward, Unsupported
from attnbench.backends.call_window import CallWindow, as_given, local_window
from attnbench.backends.masks import PreparesOnce, call_key, dense_masks
from attnbench.backends.upstream import lacking, unavailable, version_of
from attnbench.problem.packing import cu_tensor, from_thd, to_thd
from attnbench.problem.paged import decode_cache, decode_queries, packed_like


def _alibi_slopes(spec, q: torch.Tensor) -> Optional[torch.Tensor]:
    """fp32 slopes of this call's query heads (None without ALiBi)."""
    if spec.alibi_slopes is None:
        return None
    heads = range(spec.head_start, spec.head_start + q.shape[1])
    return torch.tensor([spec.alibi_slopes[h] for h in heads], dtype=torch.float32,
                        device=q.device)


XFORMERS_BIAS_ALIGNMENT = 8
"""Elements: xformers' cutlass kernels want every stride of a tensor bias but the last a multiple
of 128 bits (``_check_bias_alignment``: 8 in fp16/bf16, 4 in fp32); 8 serves every dtype."""


def _xformers_bias(spec, q: torch.Tensor, k: torch.Tensor):
    """xformers' attn_bias for one call: its bottom-right causal mask where it applies, else a
    dense (B, Hq, Sq, Sk) bias with -inf where keys are masked (ALiBi, windows). The dense bias
    is a slice of one whose rows are padded to a multiple of
    :data:`XFORMERS_BIAS_ALIGNMENT` keys (xformers' own hint: "use
    ``torch.zeros([1, 1, 5, 8])[:,:,:,:5]``"), so any Sk is aligned."""
    import xformers.ops as xops

    batch, heads_q, sq, _ = q.shape
    sk = k.shape[2]
    diag = spec.q_start + spec.diagonal_offset - spec.kv_start
    if spec.alibi_slopes is None and spec.is_causal and diag == sk - sq:
        return xops.fmha.attn_bias.LowerTriangularFromBottomRightMask()
    if spec.alibi_slopes is None and not spec.is_masked:
        return None
    bias, visible, _ = dense_masks(spec, batch, heads_q, sq, sk, q.dtype, q.device, keep=False)
    padded = -(-sk // XFORMERS_BIAS_ALIGNMENT) * XFORMERS_BIAS_ALIGNMENT
    dense = torch.zeros(heads_q, sq, padded, dtype=q.dtype, device=q.device)[..., :sk]
    if bias is not None:
        dense.copy_(bias.expand(heads_q, sq, sk))
    if visible is not None:
        dense.masked_fill_(~visible, float("-inf"))
    return dense.unsqueeze(0).expand(batch, -1, -1, -1)


def fa2_lse(lse: torch.Tensor) -> torch.Tensor:
    """FA2's log-sum-exp in attnbench's convention: float32, and -inf (not FA2's +inf) for a
    row that sees no key (flash-attn's softmax writes INFINITY where the row sum is 0), so a
    ring CP merge of such a row weighs it 0 and the lse check compares like with like."""
    lse = lse.float()
    return lse.masked_fill(lse == float("inf"), float("-inf"))


def _autograd_backward(ctx, dout):
    out, q_in, k_in, v_in = ctx
    return torch.autograd.grad(out, (q_in, k_in, v_in), dout, retain_graph=True)


FA2_PAGE_MULTIPLE = 256
"""flash-attn 2's paged cache: ``page_block_size must be a multiple of 256`` (flash_api.cpp)."""
FA2_MAX_HEAD_DIM = 256
"""``FlashAttention forward only supports head dimension at most 256`` (flash_api.cpp)."""
FA2_SINCE = {"window_size": "2.3", "alibi_slopes": "2.4", "block_table": "2.5",
             "softcap": "2.6", "return_softmax_lse": "2.6"}
"""The flash-attn 2 release whose Python functions first take each keyword (read in
flash_attn/flash_attn_interface.py at the tags v2.3.0 ... v2.6.0)."""


@dataclass(frozen=True)
class CallPlan:
    """What one call of a bottom-right library needs beyond q, k, v, derived once per call
    shape: its window (and the keys it passes) and the keywords that say the mask, scale,
    softcap and ALiBi slopes."""

    window: CallWindow
    kwargs: dict

    def keys(self, x: torch.Tensor) -> torch.Tensor:
        """K or V (B, Hkv, Sk, *) as the call passes them: cut to the keys some query sees."""
        if self.window.keys is None:
            return x
        first, end = self.window.keys
        return x[:, :, first:end]


def plan_call(module: str, fn, spec, q: torch.Tensor, window: CallWindow,
              since: Optional[dict] = None) -> CallPlan:
    """The keywords of ``fn`` (of the installed ``module``) for this call: ``causal=True`` for
    plain causal (never a (-1, 0) window: flash-attn's Sq = 1 GQA fast path needs
    ``window_size_right < 0``, flash_api.cpp ``seqlenq_ngroups_swapped``), a window only when
    there is one, softcap and slopes only when the case has them -- so an older release runs
    what it can. Raises :class:`Unsupported` with the release when ``fn`` lacks a keyword."""
    slopes = _alibi_slopes(spec, q)
    kwargs: dict = {"softmax_scale": spec.scale, "causal": window.causal}
    if window.windowed:
        kwargs["window_size"] = (window.left, window.right)
    if spec.softcap:
        kwargs["softcap"] = spec.softcap
    if slopes is not None:
        kwargs["alibi_slopes"] = slopes
    reason = lacking(module, fn, kwargs, since=since)
    if reason:
        raise Unsupported(reason)
    return CallPlan(window, kwargs)


class FlashAttnBackend(PreparesOnce):
    """flash-attn 2 (``flash_attn.flash_attn_func``; packed cases ``flash_attn_varlen_func``
    with the pack's ``cu_seqlens``, whose masks, ALiBi and bottom-right alignment are per
    sequence as in :mod:`attnbench.problem.packing`; decode cases ``flash_attn_with_kvcache``,
    contiguous or paged through ``block_table``, one cache length per sequence). A dense call
    with global offsets (all-gather CP) is mapped to its own corner by
    :func:`attnbench.backends.call_window.local_window`."""

    name = "flash_attn"
    keep_mask = None
    supports_packed = True
    paged_kv = True

    def supports(self, case, device):
        if device.type != "cuda":
            return "flash_attn runs only on CUDA devices"
        if case.dtype == "fp32":
            return "flash_attn supports fp16 and bf16 only"
        return fa2_limits(case) or unavailable("flash_attn") or fa2_release(case)

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
            plan = plan_call("flash_attn", flash_attn_with_kvcache, spec, q, as_given(spec),
                             FA2_SINCE)
            paged = {} if cache.block_table is None else {"block_table": cache.block_table}
            return cache, {**plan.kwargs, **paged}

        cache, kwargs = self.prepared.get(call_key(spec, q, k, "kvcache"), build)
        out, lse = flash_attn_with_kvcache(
            decode_queries(q, spec).transpose(1, 2), cache.k, cache.v,
            cache_seqlens=cache.seqlens, return_softmax_lse=True, **kwargs)
        out, lse = packed_like(out.transpose(1, 2), fa2_lse(lse), spec)
        return Forward(out=out, lse=lse, ctx=None)

    def forward(self, q, k, v, spec):
        if spec.decode:
            return self.decode(q, k, v, spec)
        if spec.is_packed:
            return self._varlen_forward(q, k, v, spec)
        from flash_attn import flash_attn_func

        plan = self.prepared.get(call_key(spec, q, k), lambda: plan_call(
            "flash_attn", flash_attn_func, spec, q,
            local_window(spec, q.shape[2], k.shape[2], alibi=spec.alibi_slopes is not None,
                         library="flash_attn"), FA2_SINCE))
        q_in, k_in, v_in = (t.detach().requires_grad_(True) for t in (q, k, v))
        # The log-sum-exp comes back only with return_attn_probs, which with dropout also makes
        # the kernel write the whole S x S probability matrix inside the timed call: ask for it
        # only without dropout (FA2 returns no matrix then: return_softmax and dropout_p > 0).
        with_lse = spec.dropout_p == 0
        with torch.enable_grad():
            result = flash_attn_func(
                q_in.transpose(1, 2), plan.keys(k_in).transpose(1, 2),
                plan.keys(v_in).transpose(1, 2), dropout_p=spec.dropout_p,
                return_attn_probs=with_lse, **plan.kwargs)
            out, lse = (result[0], fa2_lse(result[1])) if with_lse else (result, None)
            out = out.transpose(1, 2)
        return Forward(out=out.detach(), lse=lse, ctx=(out, q_in, k_in, v_in))

    def _varlen_forward(self, q, k, v, spec):
        """One ``flash_attn_varlen_func`` call on the pack: (1, H, T, D) -> (T, H, D). The
        offsets (int32 on the device), the longest lengths and the keywords are built once per
        case."""
        from flash_attn import flash_attn_varlen_func

        def build():
            lengths = (max(b - a for a, b in zip(cu, cu[1:]))
                       for cu in (spec.cu_seqlens_q, spec.cu_seqlens_kv))
            plan = plan_call("flash_attn", flash_attn_varlen_func, spec, q, as_given(spec),
                             FA2_SINCE)
            return (cu_tensor(spec.cu_seqlens_q, q.device),
                    cu_tensor(spec.cu_seqlens_kv, q.device), *lengths, plan.kwargs)

        cu_q, cu_k, max_q, max_k, kwargs = self.prepared.get(call_key(spec, q, k, "varlen"),
                                                             build)
        q_in, k_in, v_in = (t.detach().requires_grad_(True) for t in (q, k, v))
        with torch.enable_grad():
            result = flash_attn_varlen_func(
                to_thd(q_in), to_thd(k_in), to_thd(v_in), cu_q, cu_k, max_q, max_k,
                dropout_p=spec.dropout_p, return_attn_probs=True, **kwargs)
            out = from_thd(result[0])
        lse = fa2_lse(result[1])
        # FA2 >= 2.4 returns lse as (H, Tq); older ones padded per sequence: not comparable.
        lse = lse.unsqueeze(0) if lse.shape == (q.shape[1], q.shape[2]) else None
        return Forward(out=out.detach(), lse=lse, ctx=(out, q_in, k_in, v_in))

    backward = staticmethod(_autograd_backward)


def fa2_limits(case) -> Optional[str]:
    """What flash-attn 2 rejects whatever its release (flash_api.cpp ``mha_fwd`` /
    ``mha_varlen_fwd`` / ``mha_fwd_kvcache``), or what the harness cannot judge with it."""
    if case.head_dim_v != case.head_dim:
        return (f"flash_attn 2 takes one head dim for q, k and v (head_dim_v {case.head_dim_v} "
                f"!= head_dim {case.head_dim}: flash_api.cpp CHECK_SHAPE(v, ..., head_size))")
    if case.head_dim > FA2_MAX_HEAD_DIM:
        return (f"flash_attn 2 takes head_dim at most {FA2_MAX_HEAD_DIM}, not "
                f"{case.head_dim}")
    if case.softcap and case.dropout:
        return ("flash_attn 2 refuses softcap with dropout ('Softcapping does not support "
                "dropout for now', flash_api.cpp)")
    if case.is_packed and case.dropout:
        return ("packed case with dropout: flash_attn hides its mask and the probe that "
                "reads it back is for dense calls only")
    if case.page_size % FA2_PAGE_MULTIPLE:
        return (f"flash_attn_with_kvcache (flash-attn 2) takes pages of a multiple of "
                f"{FA2_PAGE_MULTIPLE} tokens, not page_size {case.page_size}")
    return None


def fa2_release(case) -> Optional[str]:
    """Why the installed flash-attn release cannot take what ``case`` needs (its version in
    the reason), or None."""
    import flash_attn

    fn_name = ("flash_attn_with_kvcache" if case.decode else
               "flash_attn_varlen_func" if case.is_packed else "flash_attn_func")
    fn = getattr(flash_attn, fn_name, None)
    if fn is None:
        return f"{version_of('flash_attn')} has no {fn_name}"
    names = []
    if case.window_bounds not in ((-1, -1), (-1, 0)):
        names.append("window_size")
    if case.softcap:
        names.append("softcap")
    if case.bias == "alibi":
        names.append("alibi_slopes")
    if case.decode:
        names += ["return_softmax_lse"] + (["block_table"] if case.page_size else [])
    return lacking("flash_attn", fn, names, since=FA2_SINCE)


class XformersBackend(PreparesOnce):
    """xformers ``memory_efficient_attention`` with an explicit bias tensor for ALiBi and
    windows, and its bottom-right causal mask."""

    name = "xformers"
    keep_mask = None

    def supports(self, case, device):
        if case.softcap:
            return "xformers memory_efficient_attention has no softcap"
        return unavailable("xformers.ops")

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
