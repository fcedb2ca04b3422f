"""Attention in the case's dtype with the precision of a correct fused (flash) kernel.

Legend: B = batch, Hkv = key-value heads, G = query heads per kv head (Hq = Hkv * G),
Sq / Sk = lengths, D / Dv = head dims, R = query rows of one step, BQ / BK = ``block_q`` /
``block_k``. q (B, Hq, Sq, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv), out / dout (B, Hq, Sq, Dv),
all in one dtype (fp16, bf16 or fp32) on any device; lse (B, Hq, Sq) float32.

This is the same-dtype baseline a fused backend's error is compared with (the flash-attn rule,
see DESIGN.md "Accuracy"): it rounds exactly where a correct FlashAttention-2 style kernel rounds
(``kernels/flash_fwd.py``, ``kernels/flash_bwd.py``, FA2) and nowhere else:

* forward: Q·Kᵀ of dtype values accumulated in fp32; scale, softcap, ALiBi and mask in fp32;
  online softmax over key blocks of BK keys with an fp32 running max and denominator; P (fp32,
  relative to the running max) rounded to the dtype before P·V; the P·V accumulator in fp32
  across key blocks, rescaled as the max moves; one final rounding of O; lse = max + log(denom)
  in fp32.
* backward: P recomputed in fp32 from lse; delta = rowsum(dO·O) in fp32 of the dtype values;
  dP = dO·Vᵀ in fp32; dS = P·(dP - delta) in fp32, rounded to the dtype for dS·K and dSᵀ·Q;
  P rounded to the dtype for dV = Pᵀ·dO; dQ, dK, dV accumulated in fp32 across blocks (and
  across the query heads of a GQA group), scale applied once at the end, one rounding each.
* dropout (the keep-mask provider of :mod:`attnbench.problem.attn_spec`, as in the reference): the
  normaliser uses every probability; dropped entries of P and dP are zeroed, kept ones scaled
  by 1/(1-p) — in the forward once, on the fp32 output, like the kernels do.

Every product of two dtype values is exact in fp32 (bf16: 8 + 8 significant bits, fp16:
11 + 11 <= 24), so "fp32 matmul of dtype values" is what a tensor core computes; in the fp32
case the matmuls are held to full fp32 (no TF32 / reduced-precision fp32 GEMMs).

GQA: dK/dV of a kv head sum its query heads in fp32 and are rounded once (FA3, our Triton
kernels). FA2 rounds each query head's dK/dV to the dtype before summing them (flash_api.cpp,
``dk_expanded``), so FA2 on GQA/MQA sits somewhat above this baseline on dK/dV by design.

Block sizes. The forward's rounding depends on ``block_k`` (P is rounded relative to the running
max of the key blocks seen so far; the accumulator is rescaled once per block); ``block_q`` only
sets which (query block, key block) tiles are skipped as fully masked, and the backward's blocks
only change the order of fp32 sums. The relative error therefore depends weakly on both: the
rounding of P is relative whatever the max it is taken against, and reordering fp32 sums moves
the result by ~1e-7. Measured (bf16 and fp16, S = 256 / 1024 / 4096, 4 heads, d64, causal):
block_k 32 / 64 / 128 and block_q 64 / 128 move every tensor's error by under 1 % (out:
2.00e-3 / 2.01e-3 / 2.02e-3 in bf16 at S = 1024); tests/backends/test_fused_baseline.py holds it
to 5 %.

For speed on CPU, several query blocks are processed in one tensor operation (``step_elems``
score elements per step). Rows are independent in the forward and a skipped tile is an exact
no-op of the online softmax, so the step changes no rounding of the model (on the CPU not a bit
of the forward: tested), only the order of fp32 sums in the backward. Memory is O(S·D): fp32
copies of the inputs, the accumulators and a handful of (R, BK) tiles; no S x S tensor exists.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Optional

import torch

from attnbench.problem.attn_spec import AttnSpec, KeepMaskFn
from attnbench.problem.fp8 import P_PRESCALE, Fp8Format, round_to_fp8
from attnbench.problem.packing import backward_per_sequence, forward_per_sequence

F32 = torch.float32


@contextlib.contextmanager
def _full_fp32_matmuls(dtype: torch.dtype, device: torch.device):
    """For fp32 inputs, run the block matmuls in full fp32 (a correct fp32 kernel uses no TF32
    or bf16 passes) whatever the process asked for; restored afterwards. Half dtypes need
    nothing: their values, and every product of two of them, are exact in TF32 too."""
    if dtype != F32:
        yield
        return
    matmul = torch.backends.cuda.matmul if device.type == "cuda" else torch.backends.mkldnn.matmul
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9: per-backend setting, "ieee" = full
        saved = matmul.fp32_precision
        matmul.fp32_precision = "ieee"
        try:
            yield
        finally:
            matmul.fp32_precision = saved
        return
    saved = torch.get_float32_matmul_precision()  # older torch: the one legacy switch
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved)


class _Tiles:
    """One call's inputs as fp32 copies of their dtype values, grouped for GQA, and the fp32
    scores of any (query rows, key block) tile."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttnSpec,
                 keep_mask: Optional[KeepMaskFn]):
        batch, heads_q, seqlen_q, head_dim = q.shape
        heads_kv = k.shape[1]
        if heads_q % heads_kv:
            raise ValueError(f"heads_q={heads_q} is not a multiple of heads_kv={heads_kv}")
        if spec.dropout_p > 0 and keep_mask is None:
            raise ValueError("dropout > 0 needs an explicit keep_mask provider")
        if not (q.dtype == k.dtype == v.dtype):
            raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
        self.spec = spec
        self.dtype = q.dtype
        self.device = q.device
        self.batch, self.heads_kv, self.group = batch, heads_kv, heads_q // heads_kv
        self.seqlen_q, self.seqlen_k = seqlen_q, k.shape[2]
        # fp32 copies of dtype values (exact): q (B, Hkv, G, Sq, D), k / v (B, Hkv, 1, Sk, *).
        self.q = q.to(F32).reshape(batch, heads_kv, self.group, seqlen_q, head_dim)
        self.k = k.to(F32).unsqueeze(2)
        self.v = v.to(F32).unsqueeze(2)
        self.heads = torch.arange(spec.head_start, spec.head_start + heads_q, device=q.device)
        self.batches = torch.arange(spec.batch_start, spec.batch_start + batch, device=q.device)
        self.keep_mask = keep_mask if spec.dropout_p > 0 else None

    def grouped(self, x: torch.Tensor) -> torch.Tensor:
        """(B, Hq, Sq, ...) -> fp32 (B, Hkv, G, Sq, ...)."""
        return x.to(F32).reshape(self.batch, self.heads_kv, self.group, *x.shape[2:])

    def rounded(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` rounded to the inputs' dtype, kept as fp32 values (the operand of a tensor-core
        matmul whose products and sums are fp32)."""
        return x if self.dtype == F32 else x.to(self.dtype).to(F32)

    def rows_seeing(self, j0: int, j1: int, r0: int, r1: int, block_q: int) -> tuple[int, int]:
        """Local query rows within [r0, r1), widened to whole query blocks, that see at least
        one of local keys [j0, j1): those of the tiles a kernel does not skip. Empty: (x, x)."""
        spec = self.spec
        # Query i (local) sits at key position a = i + q_start + offset; key j (global) is seen
        # iff -window_left <= j - a <= window_right: an interval of a for a key block.
        shift = spec.q_start + spec.diagonal_offset
        lo, hi = r0, r1
        if spec.window_right >= 0:
            lo = max(lo, spec.kv_start + j0 - spec.window_right - shift)
        if spec.window_left >= 0:
            hi = min(hi, spec.kv_start + j1 - 1 + spec.window_left - shift + 1)
        if lo >= hi:
            return r0, r0
        return max(r0, lo // block_q * block_q), min(r1, -(-hi // block_q) * block_q)

    def scores(self, i0: int, i1: int, j0: int, j1: int):
        """fp32 scores of local rows [i0, i1) x keys [j0, j1): (s (B, Hkv, G, R, BK) with masked
        entries -inf, tanh of the softcap or None, positions (q_pos, k_pos))."""
        spec = self.spec
        q_pos = torch.arange(spec.q_start + i0, spec.q_start + i1, device=self.device)
        k_pos = torch.arange(spec.kv_start + j0, spec.kv_start + j1, device=self.device)
        qk = torch.matmul(self.q[:, :, :, i0:i1], self.k[:, :, :, j0:j1].transpose(-1, -2))
        s, tanh = spec.score_block(qk, self.heads, q_pos, k_pos)
        self._mask(s, i0, i1, j0, j1, q_pos, k_pos)
        return s, tanh, (q_pos, k_pos)

    def _mask(self, s: torch.Tensor, i0: int, i1: int, j0: int, j1: int, q_pos: torch.Tensor,
              k_pos: torch.Tensor) -> None:
        """Set the scores s (B, Hkv, G, R, BK) of pairs outside the band to -inf, in place. Only
        rows at the band's edges can hold such pairs; the rows between them see every key of
        the block and are left alone (as a kernel skips masking on full tiles)."""
        spec = self.spec
        if not spec.is_masked:
            return
        shift = spec.q_start + spec.diagonal_offset
        full_lo, full_hi = i0, i1  # rows that see every key in [j0, j1)
        if spec.window_right >= 0:
            full_lo = max(i0, spec.kv_start + j1 - 1 - spec.window_right - shift)
        if spec.window_left >= 0:
            full_hi = min(i1, spec.kv_start + j0 + spec.window_left - shift + 1)
        edges = [(i0, full_lo), (full_hi, i1)] if full_lo < full_hi else [(i0, i1)]
        for lo, hi in edges:
            if lo < hi:
                rows = slice(lo - i0, hi - i0)
                s[..., rows, :].masked_fill_(~spec.visible(q_pos[rows], k_pos), float("-inf"))

    def keep(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> Optional[torch.Tensor]:
        """Dropout keep mask (B, Hkv, G, R, BK), True = kept; None without dropout."""
        if self.keep_mask is None:
            return None
        keep = self.keep_mask(self.spec, self.batches, self.heads, q_pos, k_pos)
        return keep.reshape(self.batch, self.heads_kv, self.group, *keep.shape[2:])


@dataclass(frozen=True, kw_only=True)
class FusedBaseline:
    """Blockwise attention with a correct fused kernel's roundings (see the module docstring).

    The three ``accumulate_*`` methods are the only places where an accumulator is updated; a
    subclass that rounds there models an accumulator kept in low precision (a bug class).
    :meth:`pv_step` computes one block's P·V before ``accumulate_pv`` takes it: a subclass that
    replaces it models tensor cores that round inside the matmul.
    """

    block_q: int = 128
    """Query rows of one kernel tile (FA2 / Triton tutorial size): tiles of block_q x block_k
    wholly outside a causal or window band are skipped."""
    block_k: int = 64
    """Keys of one kernel tile: the forward's online-softmax step (P is rounded to the dtype
    relative to the running max of the blocks seen so far)."""
    step_elems: int = 1 << 17
    """Score elements (B * Hq * rows * block_k) one tensor operation handles: 512 KiB fp32
    tiles, which stay in a CPU's L2. Measured on 2 CPU threads, bf16, S = 4096, 8 heads, d64,
    forward + backward: 2^17 1.4-1.7 s (causal 0.9 s), 2^19 about the same, 2^15 and 2^21
    slower. Speed only: no effect on the forward's bits."""

    p_format: Optional[Fp8Format] = None
    """fp8 forward (FA3's choice): P rounded to this fp8 format before P·V instead of to the
    inputs' dtype. The inputs are then the dequantized fp8 values in fp32 (exact), whose
    products and sums are what fp8 tensor cores compute."""
    p_prescale: float = P_PRESCALE
    """fp8: P is multiplied by this power of two before its rounding (and divided out after:
    exact), see :data:`attnbench.problem.fp8.P_PRESCALE`; 1 models a kernel without it."""
    out_dtype: Optional[torch.dtype] = None
    """The dtype O is rounded to once; None: the inputs' (an fp8 forward returns bf16)."""

    def __post_init__(self):
        for name in ("block_q", "block_k", "step_elems"):
            if getattr(self, name) < 1:
                raise ValueError(f"FusedBaseline: {name}: got {getattr(self, name)}, expected >= 1")

    # -- hooks -------------------------------------------------------------------------------
    def accumulate_pv(self, acc: torch.Tensor, correction: torch.Tensor, pv: torch.Tensor,
                      dtype: torch.dtype) -> torch.Tensor:
        """Forward accumulator update for one key block: acc (B, Hkv, G, R, Dv) fp32 rescaled by
        correction (B, Hkv, G, R) for the moved max, plus this block's P·V (fp32)."""
        return acc * correction[..., None] + pv

    def pv_step(self, acc: torch.Tensor, correction: torch.Tensor, p_op: torch.Tensor,
                v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """One key block's P·V (p_op (B, Hkv, G, R, keys) as the kernel's operand, v (B, Hkv,
        1, keys, Dv), fp32) computed and added into the accumulator: a model whose tensor
        cores accumulate in less than fp32 replaces this (:mod:`attnbench.accuracy.fp8_accumulation`)."""
        return self.accumulate_pv(acc, correction, torch.matmul(p_op, v), dtype)

    def accumulate_dq(self, dq: torch.Tensor, contribution: torch.Tensor,
                      dtype: torch.dtype) -> torch.Tensor:
        """Backward dQ accumulator (B, Hkv, G, R, D) fp32 plus one key block's dS·K (fp32)."""
        return dq + contribution

    def accumulate_dkv(self, acc: torch.Tensor, contribution: torch.Tensor,
                       dtype: torch.dtype) -> torch.Tensor:
        """Backward dK or dV accumulator (B, Hkv, keys, D) fp32 plus one step's contribution of
        each query head of a group (B, Hkv, G, keys, D), fp32."""
        return acc + contribution.sum(2)

    # -- the two passes ----------------------------------------------------------------------
    def _rows_per_step(self, tiles: _Tiles) -> int:
        per_row = tiles.batch * tiles.heads_kv * tiles.group * self.block_k
        blocks = max(1, self.step_elems // max(1, per_row * self.block_q))
        return blocks * self.block_q

    @torch.no_grad()
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttnSpec,
                keep_mask: Optional[KeepMaskFn] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """q (B, Hq, Sq, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv) in one dtype. Returns
        out (B, Hq, Sq, Dv) in that dtype and lse (B, Hq, Sq) float32 (natural log; rows that see
        no key: out 0, lse -inf). A packed ``spec``: each sequence alone, as a fused varlen
        kernel tiles it (:mod:`attnbench.problem.packing`)."""
        if spec.is_packed:
            return forward_per_sequence(self.forward, q, k, v, spec, keep_mask)
        tiles = _Tiles(q, k, v, spec, keep_mask)
        sq, sk, dv = tiles.seqlen_q, tiles.seqlen_k, v.shape[-1]
        lead = (tiles.batch, tiles.heads_kv, tiles.group)
        out_dtype = self.out_dtype or q.dtype
        out = torch.empty(*lead, sq, dv, dtype=out_dtype, device=q.device)
        lse = torch.empty(*lead, sq, dtype=F32, device=q.device)
        drop_scale = 1.0 / (1.0 - spec.dropout_p)
        step = self._rows_per_step(tiles)
        with _full_fp32_matmuls(q.dtype, q.device):
            for c0 in range(0, sq, step):
                c1 = min(sq, c0 + step)
                running_max = torch.full((*lead, c1 - c0), float("-inf"), dtype=F32,
                                         device=q.device)
                denom = torch.zeros_like(running_max)
                acc = torch.zeros(*lead, c1 - c0, dv, dtype=F32, device=q.device)
                for j0 in range(0, sk, self.block_k):
                    j1 = min(sk, j0 + self.block_k)
                    i0, i1 = tiles.rows_seeing(j0, j1, c0, c1, self.block_q)
                    if i0 == i1:
                        continue
                    rows = slice(i0 - c0, i1 - c0)
                    s, _, (q_pos, k_pos) = tiles.scores(i0, i1, j0, j1)
                    old_max = running_max[..., rows]
                    new_max = torch.maximum(old_max, s.amax(-1))
                    # A row that has seen no key yet keeps exp() away from (-inf) - (-inf).
                    safe_max = torch.where(torch.isinf(new_max), torch.zeros_like(new_max),
                                           new_max)
                    p = torch.exp(s - safe_max[..., None])
                    correction = torch.exp(old_max - safe_max)
                    # The normaliser sums the fp32 probabilities, dropped ones included.
                    denom[..., rows] = denom[..., rows] * correction + p.sum(-1)
                    keep = tiles.keep(q_pos, k_pos)
                    if keep is not None:
                        p = p.masked_fill(~keep, 0.0)
                    p_op = (round_to_fp8(p * self.p_prescale, self.p_format) / self.p_prescale
                            if self.p_format is not None else tiles.rounded(p))
                    acc[..., rows, :] = self.pv_step(acc[..., rows, :], correction, p_op,
                                                     tiles.v[:, :, :, j0:j1], q.dtype)
                    running_max[..., rows] = new_max
                seen = denom > 0
                safe_denom = torch.where(seen, denom, torch.ones_like(denom))
                o = acc * (drop_scale / safe_denom)[..., None]
                o = torch.where(seen[..., None], o, torch.zeros_like(o))
                out[..., c0:c1, :] = o.to(out_dtype)  # the one rounding of O
                lse[..., c0:c1] = torch.where(seen, running_max + torch.log(safe_denom),
                                              torch.full_like(denom, float("-inf")))
        heads_q = tiles.heads_kv * tiles.group
        return out.view(tiles.batch, heads_q, sq, dv), lse.view(tiles.batch, heads_q, sq)

    @torch.no_grad()
    def backward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, dout: torch.Tensor, spec: AttnSpec,
                 keep_mask: Optional[KeepMaskFn] = None):
        """Gradients of sum(out * dout). q, k, v as in :meth:`forward`; out, dout
        (B, Hq, Sq, Dv) in the dtype; lse (B, Hq, Sq) (any float dtype, used in fp32; -inf for
        rows that see no key). Returns dq (B, Hq, Sq, D), dk (B, Hkv, Sk, D), dv (B, Hkv, Sk,
        Dv) in the inputs' dtype."""
        if spec.is_packed:
            return backward_per_sequence(self.backward, q, k, v, out, lse, dout, spec,
                                         keep_mask)
        tiles = _Tiles(q, k, v, spec, keep_mask)
        sq, sk, d = tiles.seqlen_q, tiles.seqlen_k, q.shape[-1]
        lead = (tiles.batch, tiles.heads_kv, tiles.group)
        # Kernels read dO and O in the dtype; delta is their fp32 row dot product.
        dout32 = tiles.grouped(dout.to(q.dtype))
        delta = (dout32 * tiles.grouped(out.to(q.dtype))).sum(-1)           # (B, Hkv, G, Sq)
        lse32 = tiles.grouped(lse)
        lse_safe = torch.where(torch.isinf(lse32), torch.zeros_like(lse32), lse32)
        drop_scale = 1.0 / (1.0 - spec.dropout_p)
        dq = torch.zeros(*lead, sq, d, dtype=F32, device=q.device)
        dk = torch.zeros(tiles.batch, tiles.heads_kv, sk, d, dtype=F32, device=q.device)
        dv = torch.zeros(tiles.batch, tiles.heads_kv, sk, v.shape[-1], dtype=F32,
                         device=q.device)
        step = self._rows_per_step(tiles)
        with _full_fp32_matmuls(q.dtype, q.device):
            for c0 in range(0, sq, step):
                c1 = min(sq, c0 + step)
                for j0 in range(0, sk, self.block_k):
                    j1 = min(sk, j0 + self.block_k)
                    i0, i1 = tiles.rows_seeing(j0, j1, c0, c1, self.block_q)
                    if i0 == i1:
                        continue
                    s, tanh, (q_pos, k_pos) = tiles.scores(i0, i1, j0, j1)
                    p = torch.exp(s - lse_safe[..., i0:i1, None])  # masked (-inf) entries: 0
                    keep = tiles.keep(q_pos, k_pos)
                    do_blk = dout32[..., i0:i1, :]
                    p_dropped = p if keep is None else (p * drop_scale).masked_fill(~keep, 0.0)
                    dv[:, :, j0:j1] = self.accumulate_dkv(
                        dv[:, :, j0:j1],
                        torch.matmul(tiles.rounded(p_dropped).transpose(-1, -2), do_blk), q.dtype)
                    dp = torch.matmul(do_blk, tiles.v[:, :, :, j0:j1].transpose(-1, -2))
                    if keep is not None:
                        dp = (dp * drop_scale).masked_fill(~keep, 0.0)
                    ds = p * (dp - delta[..., i0:i1, None])
                    if tanh is not None:
                        ds = ds * (1.0 - tanh * tanh)
                    ds = tiles.rounded(ds)
                    dq[..., i0:i1, :] = self.accumulate_dq(
                        dq[..., i0:i1, :], torch.matmul(ds, tiles.k[:, :, :, j0:j1]), q.dtype)
                    dk_step = torch.matmul(ds.transpose(-1, -2), tiles.q[:, :, :, i0:i1])
                    dk[:, :, j0:j1] = self.accumulate_dkv(dk[:, :, j0:j1], dk_step, q.dtype)
        heads_q = tiles.heads_kv * tiles.group
        return ((dq * spec.scale).to(q.dtype).view(tiles.batch, heads_q, sq, d),
                (dk * spec.scale).to(q.dtype), dv.to(q.dtype))


def fused_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttnSpec,
                  keep_mask: Optional[KeepMaskFn] = None, block_q: int = 128,
                  block_k: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward of a correct fused kernel in q's dtype. q (B, Hq, Sq, D), k (B, Hkv, Sk, D),
    v (B, Hkv, Sk, Dv). Returns out (B, Hq, Sq, Dv) in q's dtype and lse (B, Hq, Sq) float32."""
    return FusedBaseline(block_q=block_q, block_k=block_k).forward(q, k, v, spec, keep_mask)


def fused_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, dout: torch.Tensor, spec: AttnSpec,
                   keep_mask: Optional[KeepMaskFn] = None, block_q: int = 128,
                   block_k: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward of a correct fused kernel in q's dtype, from forward's out (B, Hq, Sq, Dv) and
    lse (B, Hq, Sq). Returns dq (B, Hq, Sq, D), dk (B, Hkv, Sk, D), dv (B, Hkv, Sk, Dv)."""
    return FusedBaseline(block_q=block_q, block_k=block_k).backward(
        q, k, v, out, lse, dout, spec, keep_mask)
