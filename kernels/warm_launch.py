"""One compile variant (:mod:`attnbench.kernels.warm`) launched on minimal tensors.

Legend: B = batch, Hq / Hkv = heads, S = length, D / DV = head dims. Every tensor has the layout
the real case gives it (contiguous (B, H, S, D); a pack (1, H, T, D); decode caches as
:mod:`attnbench.problem.paged` builds them), so the JIT specialises the minimal call exactly as
the real one: same constexprs, same stride hints. The launchers are the real ones, so the
config each kernel compiles with is the one the sweep will ask for.
"""

from __future__ import annotations

import torch

from attnbench.kernels.decode import decode_forward
from attnbench.kernels.dropout import keep_mask
from attnbench.kernels.flash_bwd import flash_backward
from attnbench.kernels.flash_fwd import flash_forward, flash_forward_fp8
from attnbench.kernels.params import FlashParams
from attnbench.problem.fp8 import torch_dtype

MIN_LENGTH = 128
"""Warm tensors' length (plus the real length's residue mod 16 where it matters): no tile of
the spaces is longer, so autotune mode's length pruning keeps every config the real lengths
keep."""


def _shape(variant: dict) -> tuple[int, int, int, int]:
    """(Hq, Hkv, Sq, Sk): a group of 1 or 2 (the kernels tell only MHA from GQA), unless the
    head dims make strides follow heads and lengths (then theirs, mod 16 for the lengths)."""
    if "heads_q" in variant:
        return (variant["heads_q"], variant["heads_kv"],
                MIN_LENGTH + variant["seqlen_q_mod16"], MIN_LENGTH + variant["seqlen_kv_mod16"])
    return (2 if variant.get("group") == "gqa" else 1), 1, MIN_LENGTH, MIN_LENGTH


def _params(variant: dict, heads_q: int, cu_q=(), cu_k=()) -> FlashParams:
    return FlashParams(
        sm_scale=variant["head_dim"] ** -0.5, window_left=-1,
        window_right=0 if variant["window"] else -1, softcap=1.0 if variant["softcap"] else 0.0,
        alibi_slopes=tuple(2.0 ** -(h + 1) for h in range(heads_q)) if variant["alibi"] else None,
        dropout_p=0.1 if variant.get("dropout") else 0.0, dropout_seed=1,
        cu_seqlens_q=cu_q, cu_seqlens_kv=cu_k)


def launch_variant(variant: dict, device: torch.device) -> None:
    """Launch every kernel of ``variant`` once on ``device``."""
    if "page_size" in variant:
        _decode(variant, device)
        return
    heads_q, heads_kv, seqlen_q, seqlen_k = _shape(variant)
    d, dv = variant["head_dim"], variant["head_dim_v"]
    cu_q = cu_k = ()
    if variant["varlen"]:  # one buffer of two sequences
        cu_q, cu_k = (0, seqlen_q - 64, seqlen_q), (0, seqlen_k - 64, seqlen_k)
    batch = 1 if variant["varlen"] else 2
    params = _params(variant, heads_q, cu_q, cu_k)
    dtype = torch_dtype(variant["dtype"])
    if variant["dtype"].startswith("fp8"):
        q, k, v = (torch.randn(batch, h, s, x, device=device).to(dtype)
                   for h, s, x in ((heads_q, seqlen_q, d), (heads_kv, seqlen_k, d),
                                   (heads_kv, seqlen_k, dv)))
        ones = torch.ones(batch if not cu_q else len(cu_q) - 1, heads_kv, device=device)
        flash_forward_fp8(q, k, v, params, ones, ones, ones)
        return
    q = torch.randn(batch, heads_q, seqlen_q, d, device=device, dtype=dtype)
    k = torch.randn(batch, heads_kv, seqlen_k, d, device=device, dtype=dtype)
    v = torch.randn(batch, heads_kv, seqlen_k, dv, device=device, dtype=dtype)
    out, lse = flash_forward(q, k, v, params)
    if "_bwd_dkdv" in variant["kernels"]:
        flash_backward(q, k, v, out, lse, torch.randn_like(out), params)
    if "_keep_mask_kernel" in variant["kernels"]:
        index = torch.arange(2, device=device)
        keep_mask(params.dropout_seed, params.drop_threshold, index, index, index, index)


def _decode(variant: dict, device: torch.device) -> None:
    group, seqlen_q, page = variant["group"], variant["seqlen_q"], variant["page_size"]
    heads_kv = variant.get("heads_kv", 1)
    heads_q = group * heads_kv
    seqlen_k = MIN_LENGTH + variant.get("seqlen_kv_mod16", 0)
    d, dv = variant["head_dim"], variant["head_dim_v"]
    dtype = torch_dtype(variant["dtype"])
    batch = 2
    q = torch.randn(batch, heads_q, seqlen_q, d, device=device, dtype=dtype)
    if page:
        pages = -(-seqlen_k // page)
        k = torch.randn(batch * pages, page, heads_kv, d, device=device, dtype=dtype)
        v = torch.randn(batch * pages, page, heads_kv, dv, device=device, dtype=dtype)
        table = torch.arange(batch * pages, device=device, dtype=torch.int32).view(batch, pages)
    else:
        k = torch.randn(batch, heads_kv, seqlen_k, d, device=device, dtype=dtype)
        v = torch.randn(batch, heads_kv, seqlen_k, dv, device=device, dtype=dtype)
        table = None
    seqlens = torch.full((batch,), seqlen_k, device=device, dtype=torch.int32)
    decode_forward(q, k, v, _params(variant, heads_q), seqlens_k=seqlens, max_seqlen_k=seqlen_k,
                   heads_kv=heads_kv, block_table=table, page_size=page,
                   splits=variant["block_s"])
