"""Flash attention forward: out and the log-sum-exp the backward needs.

Legend: B = batch, Hq / Hkv = query / key-value heads, Sq / Sk = lengths, D / DV = head dims,
BM / BN = BLOCK_M / BLOCK_N. q (B, Hq, Sq, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, DV) with any
strides; out (B, Hq, Sq, DV) in q's dtype (fp8: the requested output dtype); lse (B, Hq, Sq) float32, natural log.

One program owns BM query rows of one (batch, query head) and streams the key blocks its rows can
see (online softmax, fp32 statistics and accumulator). Query head h reads key/value head
h // (Hq / Hkv) in place: K/V are never repeated. Key blocks are visited in three ranges
(see :func:`attnbench.kernels.common.key_ranges`): only the ones that straddle a mask boundary or the end
of the sequence pay for masking.

Packed (variable-length) calls, ``VARLEN``: the tensors are (1, H, T, D) and ``cu_q`` / ``cu_k``
(N + 1 int32 offsets) say where each sequence starts. The grid's second axis runs over
(sequence, head); a program reads its sequence's offsets and lengths and from there works on
that sequence alone with local indices, as on a dense batch element: no query sees another
sequence's keys, causal alignment is per sequence, and dropout is keyed by (sequence, local
positions). Query blocks past a short sequence's end visit no keys and store nothing.

fp8 (``FP8``, :func:`flash_forward_fp8`): q, k, v in float8_e4m3fn or float8_e5m2 with float32
descales per (batch row, kv head); both dots on fp8 operands with fp32 accumulation, P rounded
to v's fp8 grid, out in bf16 / fp16 / fp32 (FA3's precision; docs/fp8.md). A constexpr branch:
the other dtypes compile to the same code as without it.
"""

import torch
import triton
import triton.language as tl

from attnbench.kernels import configs
from attnbench.kernels.common import LN2, dropout_keep, key_ranges, load_tile, score_tile, \
    sequence_of, specialization
from attnbench.kernels.fp8 import max_imprecise_acc, round_to_fp8_grid, round_to_grid
from attnbench.kernels.launch import launch_tiled
from attnbench.kernels.params import FlashParams, is_interpreted, strides
from attnbench.problem.fp8 import FORMATS, P_PRESCALE


@triton.jit
def _fwd_key_range(acc, l_i, m_i, q, q_idx, k_base, v_base, stride_kn, stride_kd, stride_vn,
                   stride_vd, start, end, seqlen_k, diag, sm_scale, softcap, slope2, window_left,
                   window_right, seed, batch_g, head_g, q_start, kv_start, drop_threshold,
                   HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr,
                   WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
                   DROPOUT: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
                   FP8: tl.constexpr, P_MANT: tl.constexpr, P_MIN_EXP: tl.constexpr,
                   P_MAX: tl.constexpr, P_SCALE: tl.constexpr, QK_IMPRECISE: tl.constexpr,
                   PV_IMPRECISE: tl.constexpr):
    """Online-softmax update of (acc, l_i, m_i) over key blocks [start, end). FP8: q, k, v
    are fp8 (sm_scale has the descales of q and k folded in); P is scaled by P_SCALE (a power
    of two: P lands in (0, P_SCALE], clear of fp8's subnormals) and rounded to v's fp8 grid
    (P_MANT, P_MIN_EXP, P_MAX) before P·V; the output divides P_SCALE out. QK_IMPRECISE /
    PV_IMPRECISE: the two dots' ``max_num_imprecise_acc`` (None: Triton's default)."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    for start_n in range(start, end, BLOCK_N):
        k_idx = start_n + offs_n
        k = load_tile(k_base + k_idx[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                      k_idx, seqlen_k, offs_d, HEAD_DIM, MASK, BLOCK_D != HEAD_DIM, UPCAST)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION,
                    max_num_imprecise_acc=QK_IMPRECISE)  # (BM, BN) fp32
        s2, _ = score_tile(qk, q_idx[:, None], k_idx[None, :], diag, seqlen_k, sm_scale, softcap,
                           slope2, window_left, window_right, SOFTCAP, ALIBI, MASK, WINDOW)
        m_new = tl.maximum(m_i, tl.max(s2, 1))
        if MASK:  # a row may have seen no key yet: keep exp2 away from (-inf) - (-inf)
            m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_new_safe = m_new
        p = tl.exp2(s2 - m_new_safe[:, None])
        alpha = tl.exp2(m_i - m_new_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if DROPOUT:  # normalisation uses every probability; only the kept ones reach out
            keep = dropout_keep(seed, batch_g, head_g, q_start + q_idx[:, None],
                                kv_start + k_idx[None, :], drop_threshold)
            p = tl.where(keep, p, 0.0)
        v = load_tile(v_base + k_idx[:, None] * stride_vn + offs_dv[None, :] * stride_vd,
                      k_idx, seqlen_k, offs_dv, HEAD_DIM_V, MASK, BLOCK_DV != HEAD_DIM_V, UPCAST)
        if FP8:  # round in fp32 first: the interpreter's fp32 -> fp8 cast is wrong on carries
            p_v = round_to_fp8_grid(p * P_SCALE, P_MANT, P_MIN_EXP, P_MAX).to(v.dtype)
        else:
            p_v = p.to(v.dtype)
        # Accumulate inside the dot (the accumulator operand of wgmma): no second fp32 tile.
        # fp8 on sm_90 without promotion (PV_IMPRECISE None) that operand is summed at the
        # tensor cores' reduced precision over the whole key loop (docs/fp8.md).
        acc = tl.dot(p_v, v, acc * alpha[:, None], input_precision=DOT_PRECISION,
                     max_num_imprecise_acc=PV_IMPRECISE)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(**specialization("_attn_fwd"))
def _attn_fwd(q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, slopes_ptr, cu_q_ptr, cu_k_ptr,
              place_ptr,
              descale_q_ptr, descale_k_ptr, descale_v_ptr,
              stride_dqb, stride_dqh, stride_dkb, stride_dkh, stride_dvb, stride_dvh,
              stride_qb, stride_qh, stride_qm, stride_qd,
              stride_kb, stride_kh, stride_kn, stride_kd,
              stride_vb, stride_vh, stride_vn, stride_vd,
              stride_ob, stride_oh, stride_om, stride_od,
              heads_q, group_size, seqlen_q, seqlen_k, diag, sm_scale, softcap, window_left,
              window_right, seed, drop_threshold, drop_scale, q_start, kv_start, head_start,
              batch_start,
              HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
              DROPOUT: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
              VARLEN: tl.constexpr, FP8: tl.constexpr, P_MANT: tl.constexpr,
              P_MIN_EXP: tl.constexpr, P_MAX: tl.constexpr, P_SCALE: tl.constexpr,
              OUT_ROUND_BITS: tl.constexpr, MAX_IMPRECISE_ACC: tl.constexpr):
    # fp8 promotion interval (0: Triton's default, none on sm_90) capped at each dot's K:
    # BLOCK_D for Q·Kᵀ, BLOCK_N for P·V (at K: once per key block; docs/fp8.md has its PTX)
    QK_IMPRECISE: tl.constexpr = None if MAX_IMPRECISE_ACC == 0 else (
        MAX_IMPRECISE_ACC if MAX_IMPRECISE_ACC < BLOCK_D else BLOCK_D)
    PV_IMPRECISE: tl.constexpr = None if MAX_IMPRECISE_ACC == 0 else (
        MAX_IMPRECISE_ACC if MAX_IMPRECISE_ACC < BLOCK_N else BLOCK_N)
    # Heaviest query blocks first (causal: the last rows see the most keys) to shorten the tail.
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    batch = pid_bh // heads_q  # packed: the sequence
    head = pid_bh % heads_q
    head_kv = head // group_size
    batch_g = batch_start + batch
    head_g = head_start + head
    total_q = seqlen_q
    q_off, k_off, seqlen_q, seqlen_k, diag, q_start, kv_start, tensor_b = sequence_of(
        batch, cu_q_ptr, cu_k_ptr, place_ptr, seqlen_q, seqlen_k, diag, q_start, kv_start,
        VARLEN)
    lse_row = (tensor_b * heads_q + head).to(tl.int64) * total_q + q_off

    q_base = (q_ptr + tensor_b.to(tl.int64) * stride_qb + head.to(tl.int64) * stride_qh
              + q_off.to(tl.int64) * stride_qm)
    k_base = (k_ptr + tensor_b.to(tl.int64) * stride_kb + head_kv.to(tl.int64) * stride_kh
              + k_off.to(tl.int64) * stride_kn)
    v_base = (v_ptr + tensor_b.to(tl.int64) * stride_vb + head_kv.to(tl.int64) * stride_vh
              + k_off.to(tl.int64) * stride_vn)

    m_lo = pid_m * BLOCK_M
    q_idx = m_lo + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = load_tile(q_base + q_idx[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                  q_idx, seqlen_q, offs_d, HEAD_DIM, True, BLOCK_D != HEAD_DIM, UPCAST)
    slope2 = 0.0
    if ALIBI:
        slope2 = tl.load(slopes_ptr + head)
    out_scale = drop_scale  # drop_scale = 1 / (1 - p) for kept values
    if FP8:  # one factor per (batch row or packed sequence, kv head): fold them in once
        descale_q = tl.load(descale_q_ptr + batch * stride_dqb + head_kv * stride_dqh)
        descale_k = tl.load(descale_k_ptr + batch * stride_dkb + head_kv * stride_dkh)
        sm_scale = sm_scale * (descale_q * descale_k)
        # P·V carries P_SCALE (a power of two): divided out here, exactly
        out_scale = tl.load(descale_v_ptr + batch * stride_dvb + head_kv * stride_dvh) / P_SCALE

    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)

    start, full_start, full_end, end = key_ranges(
        m_lo, tl.minimum(m_lo + BLOCK_M, seqlen_q), diag, seqlen_k, window_left, window_right,
        BLOCK_N, WINDOW)
    if VARLEN:  # a query block past this sequence's end: no keys to visit
        live = m_lo < seqlen_q
        full_start = tl.where(live, full_start, start)
        full_end = tl.where(live, full_end, start)
        end = tl.where(live, end, start)
    acc, l_i, m_i = _fwd_key_range(
        acc, l_i, m_i, q, q_idx, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
        start, full_start, seqlen_k, diag, sm_scale, softcap, slope2, window_left, window_right,
        seed, batch_g, head_g, q_start, kv_start, drop_threshold,
        HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV, BLOCK_N, True, WINDOW, SOFTCAP, ALIBI, DROPOUT,
        UPCAST, DOT_PRECISION, FP8, P_MANT, P_MIN_EXP, P_MAX, P_SCALE, QK_IMPRECISE, PV_IMPRECISE)
    acc, l_i, m_i = _fwd_key_range(
        acc, l_i, m_i, q, q_idx, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
        full_start, full_end, seqlen_k, diag, sm_scale, softcap, slope2, window_left,
        window_right, seed, batch_g, head_g, q_start, kv_start, drop_threshold,
        HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV, BLOCK_N, False, WINDOW, SOFTCAP, ALIBI, DROPOUT,
        UPCAST, DOT_PRECISION, FP8, P_MANT, P_MIN_EXP, P_MAX, P_SCALE, QK_IMPRECISE, PV_IMPRECISE)
    acc, l_i, m_i = _fwd_key_range(
        acc, l_i, m_i, q, q_idx, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
        full_end, end, seqlen_k, diag, sm_scale, softcap, slope2, window_left, window_right,
        seed, batch_g, head_g, q_start, kv_start, drop_threshold,
        HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV, BLOCK_N, True, WINDOW, SOFTCAP, ALIBI, DROPOUT,
        UPCAST, DOT_PRECISION, FP8, P_MANT, P_MIN_EXP, P_MAX, P_SCALE, QK_IMPRECISE, PV_IMPRECISE)

    # Rows that saw no key: out = 0, lse = -inf (flash-attn's convention).
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    out = acc * (out_scale / l_safe)[:, None]
    if OUT_ROUND_BITS > 0:  # the interpreter truncates fp32 -> bf16: round on the grid first
        out = round_to_grid(out, OUT_ROUND_BITS)
    lse = tl.where(seen, (m_i + tl.log2(l_safe)) * LN2, float("-inf"))

    o_base = (out_ptr + tensor_b.to(tl.int64) * stride_ob + head.to(tl.int64) * stride_oh
              + q_off.to(tl.int64) * stride_om)
    o_ptrs = o_base + q_idx[:, None] * stride_om + offs_dv[None, :] * stride_od
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty),
             mask=(q_idx[:, None] < seqlen_q) & (offs_dv[None, :] < HEAD_DIM_V))
    tl.store(lse_ptr + lse_row + q_idx, lse, mask=q_idx < seqlen_q)


_attn_fwd_tuned = triton.autotune(
    configs=configs.FWD_CONFIGS,
    key=["seqlen_q", "seqlen_k", "HEAD_DIM", "HEAD_DIM_V", "WINDOW", "SOFTCAP", "ALIBI", "DROPOUT",
         "VARLEN", "FP8"],
    prune_configs_by={"early_config_prune": configs.prune_fwd},
    **configs.AUTOTUNE_CACHE,
)(_attn_fwd)


def kernels_interpreted() -> bool:
    """Whether the kernels run in Triton's interpreter (decided when they were defined: see
    attnbench.kernels)."""
    return is_interpreted(_attn_fwd)


def forward_args(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: FlashParams, *,
                 interpreted: bool, descales: "tuple | None" = None,
                 out_dtype: "torch.dtype | None" = None) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Allocate out (B, Hq, Sq, DV) in ``out_dtype`` (default q's dtype) and lse (B, Hq, Sq);
    return them with the kernel's keyword arguments (everything but the tile sizes). Works on
    meta tensors too (compile checks). ``descales`` (descale_q, descale_k, descale_v): the fp8
    path (:func:`flash_forward_fp8`)."""
    batch, heads_q, seqlen_q, head_dim = q.shape
    _, heads_kv, seqlen_k, head_dim_v = v.shape
    out = torch.empty((batch, heads_q, seqlen_q, head_dim_v), dtype=out_dtype or q.dtype,
                      device=q.device)
    lse = torch.empty((batch, heads_q, seqlen_q), dtype=torch.float32, device=q.device)
    args = dict(
        q_ptr=q, k_ptr=k, v_ptr=v, out_ptr=out, lse_ptr=lse,
        slopes_ptr=params.slopes_log2(q.device, heads_q), **params.cu_tensors(q.device),
        **strides("q", q, "m"), **strides("k", k, "n"), **strides("v", v, "n"),
        **strides("o", out, "m"),
        heads_q=heads_q, group_size=heads_q // heads_kv, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
        **params.kernel_scalars(),
        **params.kernel_flags(q.dtype, head_dim, head_dim_v, interpreted=interpreted),
    )
    if descales is None:  # never read (FP8 off): any fp32 pointer will do
        args.update({f"descale_{x}_ptr": lse for x in "qkv"},
                    **{f"stride_d{x}{d}": 0 for x in "qkv" for d in "bh"},
                    FP8=False, P_MANT=0, P_MIN_EXP=0, P_MAX=0.0, P_SCALE=1.0,
                    OUT_ROUND_BITS=0, MAX_IMPRECISE_ACC=0)
    else:
        args.update(fp8_args(v.dtype, descales, params.grid_rows(batch, seqlen_q, 1)[1],
                             heads_kv, out.dtype, q.device, interpreted=interpreted))
        # An 8-bit tl.dot needs K >= 32 (Triton's min_dot_size): pad Q·Kᵀ's head dim.
        args["BLOCK_D"] = max(args["BLOCK_D"], FP8_MIN_DOT_K)
    return out, lse, args


def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: FlashParams,
                  config: "configs.BlockConfig | None" = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward kernel; return out (B, Hq, Sq, DV) in q's dtype and lse (B, Hq, Sq)
    float32 (natural log, -inf for rows that see no key).

    ``config`` pins the block sizes (tests use small blocks to exercise many-block paths); by
    default the GPU autotunes over :data:`attnbench.kernels.configs.FWD_CONFIGS` (or runs the
    pinned config: :mod:`attnbench.kernels.launch`) and the interpreter uses
    :data:`attnbench.kernels.configs.INTERPRETER_FWD`.
    """
    interpreted = is_interpreted(_attn_fwd)
    out, lse, args = forward_args(q, k, v, params, interpreted=interpreted)
    _launch(args, params, q, interpreted, config)
    return out, lse


def _launch(args: dict, params: FlashParams, q: torch.Tensor, interpreted: bool,
            config: "configs.BlockConfig | None") -> None:
    # Packed: one program row per (sequence, head), as many query blocks as the longest has.
    seqlen_q, rows = params.grid_rows(q.shape[0], q.shape[2], q.shape[1])
    launch_tiled(_attn_fwd, _attn_fwd_tuned, "fwd",
                 lambda block_m, block_n: (triton.cdiv(seqlen_q, block_m), rows), args,
                 interpreted=interpreted, config=config, interpreter_config=configs.INTERPRETER_FWD)


# -- fp8 -------------------------------------------------------------------------------------
FP8_MIN_CAPABILITY = (8, 9)
"""fp8 tl.dot (e4m3 and e5m2 tensor-core MMA) needs Ada (sm_89) or Hopper (sm_90) and later."""
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
FP8_MIN_DOT_K = 32
"""Smallest K of an 8-bit tl.dot on NVIDIA GPUs: the padded head dim of Q·Kᵀ and BLOCK_N
(the K of P·V; every autotuned config has BLOCK_N >= 64)."""


def fp8_args(v_dtype: torch.dtype, descales: tuple, rows: int, heads_kv: int,
             out_dtype: torch.dtype, device: torch.device, *, interpreted: bool) -> dict:
    """The fp8 kernel arguments: the descales as (rows, Hkv) float32 views (a per-tensor or
    per-row factor broadcast with stride 0, no copy of an fp32 tensor already on ``device``),
    the grid P is rounded to (v's format), and the output rounding the interpreter needs."""
    fmt = next((f for f in FORMATS.values() if f.torch_dtype == v_dtype), None)
    if fmt is None:
        raise ValueError(f"fp8 forward: v is {v_dtype}, expected one of "
                         f"{[f.torch_dtype for f in FORMATS.values()]}")
    args = {}
    for name, d in zip("qkv", descales):
        d = torch.as_tensor(d, dtype=torch.float32, device=device)
        try:
            d = torch.broadcast_to(d, (rows, heads_kv))
        except RuntimeError:
            raise ValueError(f"descale_{name}: shape {tuple(d.shape)} does not broadcast to "
                             f"(batch rows or packed sequences, kv heads) = ({rows}, {heads_kv})"
                             ) from None
        args[f"descale_{name}_ptr"] = d
        args[f"stride_d{name}b"], args[f"stride_d{name}h"] = d.stride()
    return dict(args, FP8=True, P_MANT=fmt.mantissa_bits, P_MIN_EXP=fmt.min_normal_exp,
                P_MAX=fmt.max_finite, P_SCALE=P_PRESCALE,
                # Triton 3.9's interpreter truncates fp32 -> bf16 (fp16 casts round correctly);
                # a GPU's cvt.rn rounds, and rounding there first would change nothing.
                OUT_ROUND_BITS=7 if interpreted and out_dtype == torch.bfloat16 else 0,
                MAX_IMPRECISE_ACC=max_imprecise_acc(),
                # fp8 loads, dots and casts of on-grid values are exact in the interpreter
                # (docs/fp8.md): the operands stay fp8 everywhere.
                UPCAST=False)


def check_fp8_device(device: torch.device) -> None:
    """Raise if ``device`` is a GPU without fp8 tensor cores (compute capability < 8.9)."""
    if device.type != "cuda":
        return
    capability = torch.cuda.get_device_capability(device)
    if capability < FP8_MIN_CAPABILITY:
        raise RuntimeError(
            f"fp8 attention needs fp8 tensor cores (compute capability >= 8.9: Ada, Hopper or "
            f"later); {torch.cuda.get_device_name(device)} is {capability[0]}.{capability[1]}")


def flash_forward_fp8(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, params: FlashParams,
                      descale_q: torch.Tensor, descale_k: torch.Tensor, descale_v: torch.Tensor,
                      out_dtype: torch.dtype = torch.bfloat16,
                      config: "configs.BlockConfig | None" = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 forward (FlashAttention-3's precision): attention of q8 * descale_q, k8 * descale_k,
    v8 * descale_v with every feature of :func:`flash_forward` but dropout.

    q8 (B, Hq, Sq, D), k8 (B, Hkv, Sk, D), v8 (B, Hkv, Sk, DV): all float8_e4m3fn or all
    float8_e5m2 (packed: B == 1 and ``params.cu_seqlens_*``). descale_* float32 (B, Hkv), one
    factor per batch row and kv head (query head h uses kv head h // (Hq / Hkv)); a per-tensor
    factor is passed broadcast to that shape (any shape that broadcasts is taken; packed: B is
    1 or the number of sequences).

    Roundings: S = q8·k8ᵀ accumulated in fp32, times descale_q * descale_k (folded into the
    scale per program); online softmax in fp32; P (relative to the running max) rounded to v8's
    fp8 grid before P·V, accumulated in fp32; out = acc / l * descale_v rounded once to
    ``out_dtype``. Returns out (B, Hq, Sq, DV) in ``out_dtype`` and lse (B, Hq, Sq) float32 of
    the dequantized scores (-inf and out 0 for rows that see no key).
    """
    dtypes = {q8.dtype, k8.dtype, v8.dtype}
    if len(dtypes) != 1 or not any(f.torch_dtype in dtypes for f in FORMATS.values()):
        raise ValueError(f"fp8 forward: q, k, v must all be float8_e4m3fn or all float8_e5m2, "
                         f"got {q8.dtype}, {k8.dtype}, {v8.dtype}")
    if params.dropout_p > 0:
        raise ValueError("fp8 forward: dropout is not supported")
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"fp8 forward: out_dtype {out_dtype} is not one of {OUT_DTYPES}")
    if q8.shape[1] % k8.shape[1]:
        raise ValueError(f"heads_q={q8.shape[1]} is not a multiple of heads_kv={k8.shape[1]}")
    check_fp8_device(q8.device)
    interpreted = is_interpreted(_attn_fwd)
    if config is not None and not interpreted and config.block_n < FP8_MIN_DOT_K:
        raise ValueError(f"fp8 forward: BLOCK_N {config.block_n} < {FP8_MIN_DOT_K}, the "
                         "smallest K of an fp8 tl.dot (P·V) on a GPU")
    out, lse, args = forward_args(q8, k8, v8, params, interpreted=interpreted,
                                  descales=(descale_q, descale_k, descale_v), out_dtype=out_dtype)
    _launch(args, params, q8, interpreted, config)
    return out, lse
