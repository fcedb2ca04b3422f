"""``triton``: attnbench's own flash attention (:mod:`attnbench.kernels`), forward and backward.

Decode cases (``decode: true``) run the split-KV kernel of :mod:`attnbench.kernels.decode` instead,
on a contiguous or paged cache (forward only).

Everything of :mod:`attnbench.problem.attn_spec` is native: MHA/GQA/MQA without repeating K/V,
causal (bottom-right) and sliding-window masks, ALiBi, softcap, dropout, any lengths, Sq != Sk,
global offsets of a context/tensor-parallel slice, and packed variable-length batches
(``cu_seqlens``: one launch per kernel for the whole pack, no padding). The backward is
deterministic (no atomics).

Dropout draws Philox numbers keyed by global (batch, query head, query, key) positions;
:attr:`TritonBackend.keep_mask` materializes that exact mask (the same device function the
kernels call) so the fp64 reference reuses it.

Without a CUDA device the kernels run under ``TRITON_INTERPRET=1`` (slow, exact fp32 math; fine
for CI-sized cases). Triton reads that variable when ``@triton.jit`` decorates a kernel, so it
must be set before the kernel modules are imported; importing the :mod:`attnbench.kernels` package
(first thing below) sets it when ``torch.cuda.is_available()`` is False — see
``kernels/__init__.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import attnbench.kernels  # noqa: F401  (sets TRITON_INTERPRET=1 without a GPU, before any @triton.jit)
import torch
from attnbench.kernels.decode import decode_forward
from attnbench.kernels.dropout import keep_mask as _kernel_keep_mask
from attnbench.kernels.flash_bwd import flash_backward
from attnbench.kernels.flash_fwd import (FP8_MIN_CAPABILITY, flash_forward, flash_forward_fp8,
                                         kernels_interpreted)
from attnbench.kernels.params import FlashParams, dropout_threshold

from attnbench.backends.base import Forward, Unsupported
from attnbench.backends.masks import PreparesOnce, call_key
from attnbench.dtypes import is_fp8
from attnbench.problem.attn_spec import AttnSpec
from attnbench.problem.fp8 import descale_tensors
from attnbench.problem.paged import decode_cache, decode_queries, packed_like
from attnbench.results.records import TENSORS

MAX_HEAD_DIM = 256  # tiles are (BLOCK, head_dim) in registers/shared memory; 256 is the largest
MAX_SEQLEN = 1 << 30  # attnbench.kernels.common.UNBOUNDED stands for "no window bound"
MAX_TILE_OFFSET = 1 << 31
"""The flash kernels add int64 bases per (batch, head, sequence) but index inside one with int32
``position * row stride`` (the row stride of a contiguous (B, H, S, D) tensor is D): a length
times head dim of 2^31 (16M tokens at d128) would wrap. Decode indexes its cache in int64."""


def flash_params(spec: AttnSpec) -> FlashParams:
    """Kernel parameters of one call: the spec's global problem seen from this slice."""
    return FlashParams(
        sm_scale=spec.scale,
        diag=spec.q_start + spec.diagonal_offset - spec.kv_start,
        window_left=spec.window_left,
        window_right=spec.window_right,
        softcap=spec.softcap,
        alibi_slopes=spec.alibi_slopes,
        dropout_p=spec.dropout_p,
        dropout_seed=spec.dropout_seed,
        q_start=spec.q_start,
        kv_start=spec.kv_start,
        head_start=spec.head_start,
        batch_start=spec.batch_start,
        cu_seqlens_q=spec.cu_seqlens_q,
        cu_seqlens_kv=spec.cu_seqlens_kv,
        seq_q_start=spec.seq_q_start,
        seq_kv_start=spec.seq_kv_start,
        seqlens_q_total=spec.seqlens_q_total,
        seqlens_kv_total=spec.seqlens_kv_total,
    )


def triton_keep_mask(spec: AttnSpec, b: torch.Tensor, h: torch.Tensor, i: torch.Tensor,
                     j: torch.Tensor) -> torch.Tensor:
    """KeepMaskFn: bool (len b, len h, len i, len j) for global indices, True = kept — the mask
    the triton kernels draw for ``spec``."""
    return _kernel_keep_mask(spec.dropout_seed, dropout_threshold(spec.dropout_p), b, h, i, j)


@dataclass
class _Context:
    """What backward needs; read-only, so backward may run any number of times."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    out: torch.Tensor
    lse: torch.Tensor
    params: FlashParams


class TritonBackend(PreparesOnce):
    name = "triton"
    paged_kv = True  # decode cases: the split-KV kernel reads pages through the block table
    keep_mask = staticmethod(triton_keep_mask)
    # No atomics: dK/dV per key block, dQ in its own pass, fixed loop orders. The harness
    # holds us to it (three backward calls must agree bit for bit).
    deterministic = True
    # one launch per kernel for the whole pack, with cu_seqlens; decode: one cache length per
    # sequence (seqlens_kv)
    supports_packed = True
    # fp8: the forward with fp8 tl.dot and (B, Hkv) descales (flash_forward_fp8), forward only
    supports_fp8 = True
    # packed CP: each sequence's chunk placed in its sequence (AttnSpec.seq_q_start, ...), read
    # per sequence by the kernels, so a ring step is one launch for the whole local pack
    supports_packed_chunks = True

    def supports(self, case, device) -> str | None:
        interpreted = kernels_interpreted()
        if device.type != "cuda" and not interpreted:
            return (f"triton kernels were compiled for CUDA; a {device.type} device needs "
                    "TRITON_INTERPRET=1 (set by default only when no GPU is visible)")
        if max(case.head_dim, case.head_dim_v) > MAX_HEAD_DIM:
            return f"head_dim {max(case.head_dim, case.head_dim_v)} > {MAX_HEAD_DIM}"
        if max(case.seqlen_q, case.seqlen_kv) > MAX_SEQLEN:
            return f"sequence longer than {MAX_SEQLEN}"
        span = max(case.seqlen_q, case.seqlen_kv) * max(case.head_dim, case.head_dim_v)
        if not case.decode and span >= MAX_TILE_OFFSET:
            return (f"sequence x head dim = {span} >= 2^31: the kernels' offsets inside one "
                    "(batch, head) are int32")
        if is_fp8(case.dtype) and device.type == "cuda" \
                and torch.cuda.get_device_capability(device) < FP8_MIN_CAPABILITY:
            return ("fp8 tl.dot needs fp8 tensor cores (compute capability >= 8.9); this GPU "
                    "is {}.{}".format(*torch.cuda.get_device_capability(device)))
        return None

    def input_precision(self, case, device):
        """Under the interpreter (no GPU) Triton 3.9 truncates fp32 -> bf16 casts instead of
        rounding them (measured: a -2.8e-3 mean bias, twice the RMS error of round-to-nearest)
        and our kernels keep P in fp32 there, so half-precision results are not a fused kernel's:
        judged like naive. fp32, and everything on a GPU, is judged as a fused kernel."""
        if kernels_interpreted() and case.dtype in ("fp16", "bf16"):
            return TENSORS
        return ()  # fp8: its bf16 output is rounded to nearest in the kernel (round_to_grid)

    def forward(self, q, k, v, spec: AttnSpec) -> Forward:
        if q.shape[1] % k.shape[1]:
            raise Unsupported(f"heads_q={q.shape[1]} is not a multiple of heads_kv={k.shape[1]}")
        params = flash_params(spec)
        if spec.decode:
            return self.decode(q, k, v, spec, params)
        if spec.fp8_format:  # forward only; the descale tensors are built once per case
            descales = self.prepared.get(
                call_key(spec, q, k, "descale"),
                lambda: descale_tensors(spec, q.shape[0], k.shape[1], q.device))
            out, lse = flash_forward_fp8(q, k, v, params, *descales)
            return Forward(out=out, lse=lse, ctx=None)
        out, lse = flash_forward(q, k, v, params)
        return Forward(out=out, lse=lse, ctx=_Context(q, k, v, out, lse, params))

    def decode(self, q, k, v, spec: AttnSpec, params: FlashParams, merge=None) -> Forward:
        """Decode cases: the split-KV kernel (:mod:`attnbench.kernels.decode`) over the cache as
        :func:`attnbench.problem.paged.decode_cache` lays it out (built once per case)."""
        cache = self.prepared.get(call_key(spec, q, k, "cache"), lambda: decode_cache(spec, k, v))
        out, lse = decode_forward(decode_queries(q, spec), cache.k, cache.v, params,
                                  seqlens_k=cache.seqlens, max_seqlen_k=cache.max_seqlen,
                                  heads_kv=k.shape[1], block_table=cache.block_table,
                                  page_size=cache.page_size, merge=merge)
        out, lse = packed_like(out, lse, spec)
        return Forward(out=out, lse=lse, ctx=None)

    def backward(self, ctx: _Context, dout):
        return flash_backward(ctx.q, ctx.k, ctx.v, ctx.out, ctx.lse, dout, ctx.params)

    def backward_from_stats(self, q, k, v, out, lse, dout, spec: AttnSpec):
        """Gradients of one K/V block of a larger softmax (ring context parallelism), from that
        softmax's merged ``out`` and ``lse``: the kernels' backward already recomputes P from
        (out, lse) and keys masks, ALiBi and dropout by the spec's global offsets."""
        return flash_backward(q, k, v, out, lse.float().contiguous(), dout, flash_params(spec))
