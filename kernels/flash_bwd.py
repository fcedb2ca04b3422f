"""Flash attention backward: dQ, dK, dV from q, k, v, out, dout and the forward's lse.

Legend: B = batch, Hq / Hkv = query / key-value heads, G = Hq / Hkv (group size), Sq / Sk =
lengths, D / DV = head dims, BM / BN = BLOCK_M / BLOCK_N. dq (B, Hq, Sq, D), dk (B, Hkv, Sk, D),
dv (B, Hkv, Sk, DV), all in the inputs' dtype; fp32 accumulation throughout.

Three kernels, no atomics, so results are deterministic by construction:

1. ``_bwd_preprocess``: delta_i = sum_d dout_id * out_id (= sum_j P_ij dP_ij, dropout included,
   since out already carries the kept, rescaled probabilities).
2. ``_bwd_dkdv``: a program owns BN keys of one (batch, kv head) and streams every query block of
   every query head of its group past them, recomputing P from lse: GQA/MQA need no repeated
   K/V and no reduction across programs.
3. ``_bwd_dq``: a program owns BM queries of one (batch, query head) and streams the key blocks
   they see (a separate pass rather than atomics: deterministic, and the recompute is cheap next
   to the two matmuls it feeds).

With S = scale*qk (then softcap t = tanh(S/c), S' = c*t), P = softmax(S' + bias, masked),
Z = keep / (1 - p): dV = (P*Z)^T dO, dP = dO V^T * Z, dS' = P * (dP - delta),
dS = dS' * (1 - t^2) under softcap, dQ = scale * dS K, dK = scale * dS^T Q.

Packed calls (``VARLEN``, see :mod:`attnbench.kernels.flash_fwd`): the delta pass is row-wise and runs on
the whole (1, Hq, T) buffer unchanged; the dK/dV and dQ programs read their sequence's offsets
and work on it alone, as the forward does.
"""

import torch
import triton
import triton.language as tl

from attnbench.kernels import configs
from attnbench.kernels.common import LOG2E, dropout_keep, key_ranges, load_tile, query_ranges, \
    score_tile, sequence_of, specialization
from attnbench.kernels.compile_watch import note_launch
from attnbench.kernels.launch import launch_tiled
from attnbench.kernels.params import FlashParams, is_interpreted, strides


@triton.jit(**specialization("_bwd_preprocess"))
def _bwd_preprocess(out_ptr, dout_ptr, delta_ptr,
                    stride_ob, stride_oh, stride_om, stride_od,
                    stride_dob, stride_doh, stride_dom, stride_dod,
                    heads_q, seqlen_q,
                    HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr,
                    UPCAST: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    batch = (pid_bh // heads_q).to(tl.int64)
    head = (pid_bh % heads_q).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_DV)
    o = load_tile(out_ptr + batch * stride_ob + head * stride_oh + rows[:, None] * stride_om
                  + cols[None, :] * stride_od, rows, seqlen_q, cols, HEAD_DIM_V, True,
                  BLOCK_DV != HEAD_DIM_V, UPCAST)
    do = load_tile(dout_ptr + batch * stride_dob + head * stride_doh + rows[:, None] * stride_dom
                   + cols[None, :] * stride_dod, rows, seqlen_q, cols, HEAD_DIM_V, True,
                   BLOCK_DV != HEAD_DIM_V, UPCAST)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(delta_ptr + pid_bh.to(tl.int64) * seqlen_q + rows, delta, mask=rows < seqlen_q)


@triton.jit
def _dkdv_query_range(dk, dv, k, v, k_idx, q_base, do_base, lse_base, delta_base,
                      stride_qm, stride_qd, stride_dom, stride_dod, start, end, seqlen_q,
                      seqlen_k, diag, sm_scale, softcap, slope2, window_left, window_right, seed,
                      batch_g, head_g, q_start, kv_start, drop_threshold, drop_scale,
                      HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_D: tl.constexpr,
                      BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, MASK: tl.constexpr,
                      WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
                      DROPOUT: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Accumulate dK, dV of one key block over query blocks [start, end) of one query head.
    Tiles are transposed, (BN, BM), so that dK += dS^T Q needs no transpose of dS."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    for start_m in range(start, end, BLOCK_M):
        q_idx = start_m + offs_m
        q = load_tile(q_base + q_idx[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                      q_idx, seqlen_q, offs_d, HEAD_DIM, MASK, BLOCK_D != HEAD_DIM, UPCAST)
        do = load_tile(do_base + q_idx[:, None] * stride_dom + offs_dv[None, :] * stride_dod,
                       q_idx, seqlen_q, offs_dv, HEAD_DIM_V, MASK, BLOCK_DV != HEAD_DIM_V, UPCAST)
        if MASK:
            # Padding rows and rows that see no key (lse = -inf) must give P = 0: lse -> +inf.
            lse = tl.load(lse_base + q_idx, mask=q_idx < seqlen_q, other=float("inf"))
            lse = tl.where(lse == float("-inf"), float("inf"), lse)
            delta = tl.load(delta_base + q_idx, mask=q_idx < seqlen_q, other=0.0)
        else:  # every row of a fully visible block sees at least the keys of this block
            lse = tl.load(lse_base + q_idx)
            delta = tl.load(delta_base + q_idx)
        qk_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)  # (BN, BM)
        s2_t, t_t = score_tile(qk_t, q_idx[None, :], k_idx[:, None], diag, seqlen_k, sm_scale,
                               softcap, slope2, window_left, window_right, SOFTCAP, ALIBI, MASK,
                               WINDOW)
        p_t = tl.exp2(s2_t - (lse * LOG2E)[None, :])
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)  # (BN, BM)
        if DROPOUT:
            keep_t = dropout_keep(seed, batch_g, head_g, q_start + q_idx[None, :],
                                  kv_start + k_idx[:, None], drop_threshold)
            pz_t = tl.where(keep_t, p_t * drop_scale, 0.0)
            dp_t = tl.where(keep_t, dp_t * drop_scale, 0.0)
        else:
            pz_t = p_t
        dv = tl.dot(pz_t.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        if SOFTCAP:
            ds_t = ds_t * (1.0 - t_t * t_t)
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit(**specialization("_bwd_dkdv"))
def _bwd_dkdv(q_ptr, k_ptr, v_ptr, dout_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, slopes_ptr,
              cu_q_ptr, cu_k_ptr, place_ptr,
              stride_qb, stride_qh, stride_qm, stride_qd,
              stride_kb, stride_kh, stride_kn, stride_kd,
              stride_vb, stride_vh, stride_vn, stride_vd,
              stride_dob, stride_doh, stride_dom, stride_dod,
              stride_dkb, stride_dkh, stride_dkn, stride_dkd,
              stride_dvb, stride_dvh, stride_dvn, stride_dvd,
              heads_q, heads_kv, group_size, seqlen_q, seqlen_k, diag, sm_scale, softcap,
              window_left, window_right, seed, drop_threshold, drop_scale, q_start, kv_start,
              head_start, batch_start,
              HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
              DROPOUT: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
              VARLEN: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    batch = pid_bh // heads_kv  # packed: the sequence
    head_kv = pid_bh % heads_kv
    batch_g = batch_start + batch
    total_q = seqlen_q
    q_off, k_off, seqlen_q, seqlen_k, diag, q_start, kv_start, tensor_b = sequence_of(
        batch, cu_q_ptr, cu_k_ptr, place_ptr, seqlen_q, seqlen_k, diag, q_start, kv_start,
        VARLEN)

    n_lo = pid_n * BLOCK_N
    k_idx = n_lo + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    k_base = (k_ptr + tensor_b.to(tl.int64) * stride_kb + head_kv.to(tl.int64) * stride_kh
              + k_off.to(tl.int64) * stride_kn)
    v_base = (v_ptr + tensor_b.to(tl.int64) * stride_vb + head_kv.to(tl.int64) * stride_vh
              + k_off.to(tl.int64) * stride_vn)
    k = load_tile(k_base + k_idx[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                  k_idx, seqlen_k, offs_d, HEAD_DIM, True, BLOCK_D != HEAD_DIM, UPCAST)
    v = load_tile(v_base + k_idx[:, None] * stride_vn + offs_dv[None, :] * stride_vd,
                  k_idx, seqlen_k, offs_dv, HEAD_DIM_V, True, BLOCK_DV != HEAD_DIM_V, UPCAST)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)

    start, full_start, full_end, end = query_ranges(
        n_lo, n_lo + BLOCK_N, diag, seqlen_q, seqlen_k, window_left, window_right, BLOCK_M, WINDOW)
    if VARLEN:  # a key block past this sequence's end: no queries to visit
        live = n_lo < seqlen_k
        full_start = tl.where(live, full_start, start)
        full_end = tl.where(live, full_end, start)
        end = tl.where(live, end, start)
    for g in range(0, group_size):  # the query heads that read this kv head, in a fixed order
        head = head_kv * group_size + g
        head_g = head_start + head
        q_base = (q_ptr + tensor_b.to(tl.int64) * stride_qb + head.to(tl.int64) * stride_qh
                  + q_off.to(tl.int64) * stride_qm)
        do_base = (dout_ptr + tensor_b.to(tl.int64) * stride_dob
                   + head.to(tl.int64) * stride_doh + q_off.to(tl.int64) * stride_dom)
        # lse / delta rows: (B, Hq, Sq) contiguous; packed (1, Hq, T) from this sequence's start
        row = (tensor_b * heads_q + head).to(tl.int64) * total_q + q_off
        slope2 = 0.0
        if ALIBI:
            slope2 = tl.load(slopes_ptr + head)
        dk, dv = _dkdv_query_range(
            dk, dv, k, v, k_idx, q_base, do_base, lse_ptr + row, delta_ptr + row,
            stride_qm, stride_qd, stride_dom, stride_dod, start, full_start, seqlen_q, seqlen_k,
            diag, sm_scale, softcap, slope2, window_left, window_right, seed, batch_g, head_g,
            q_start, kv_start, drop_threshold, drop_scale, HEAD_DIM, HEAD_DIM_V, BLOCK_D,
            BLOCK_DV, BLOCK_M, True, WINDOW, SOFTCAP, ALIBI, DROPOUT, UPCAST, DOT_PRECISION)
        dk, dv = _dkdv_query_range(
            dk, dv, k, v, k_idx, q_base, do_base, lse_ptr + row, delta_ptr + row,
            stride_qm, stride_qd, stride_dom, stride_dod, full_start, full_end, seqlen_q,
            seqlen_k, diag, sm_scale, softcap, slope2, window_left, window_right, seed, batch_g,
            head_g, q_start, kv_start, drop_threshold, drop_scale, HEAD_DIM, HEAD_DIM_V, BLOCK_D,
            BLOCK_DV, BLOCK_M, False, WINDOW, SOFTCAP, ALIBI, DROPOUT, UPCAST, DOT_PRECISION)
        dk, dv = _dkdv_query_range(
            dk, dv, k, v, k_idx, q_base, do_base, lse_ptr + row, delta_ptr + row,
            stride_qm, stride_qd, stride_dom, stride_dod, full_end, end, seqlen_q, seqlen_k,
            diag, sm_scale, softcap, slope2, window_left, window_right, seed, batch_g, head_g,
            q_start, kv_start, drop_threshold, drop_scale, HEAD_DIM, HEAD_DIM_V, BLOCK_D,
            BLOCK_DV, BLOCK_M, True, WINDOW, SOFTCAP, ALIBI, DROPOUT, UPCAST, DOT_PRECISION)

    dk = dk * sm_scale
    store_rows = k_idx[:, None] < seqlen_k
    dk_base = (dk_ptr + tensor_b.to(tl.int64) * stride_dkb + head_kv.to(tl.int64) * stride_dkh
               + k_off.to(tl.int64) * stride_dkn)
    dv_base = (dv_ptr + tensor_b.to(tl.int64) * stride_dvb + head_kv.to(tl.int64) * stride_dvh
               + k_off.to(tl.int64) * stride_dvn)
    tl.store(dk_base + k_idx[:, None] * stride_dkn + offs_d[None, :] * stride_dkd,
             dk.to(dk_ptr.dtype.element_ty), mask=store_rows & (offs_d[None, :] < HEAD_DIM))
    tl.store(dv_base + k_idx[:, None] * stride_dvn + offs_dv[None, :] * stride_dvd,
             dv.to(dv_ptr.dtype.element_ty), mask=store_rows & (offs_dv[None, :] < HEAD_DIM_V))


@triton.jit
def _dq_key_range(dq, q, do, lse2, delta, q_idx, k_base, v_base, stride_kn, stride_kd, stride_vn,
                  stride_vd, start, end, seqlen_k, diag, sm_scale, softcap, slope2, window_left,
                  window_right, seed, batch_g, head_g, q_start, kv_start, drop_threshold,
                  drop_scale, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
                  MASK: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
                  ALIBI: tl.constexpr, DROPOUT: tl.constexpr, UPCAST: tl.constexpr,
                  DOT_PRECISION: tl.constexpr):
    """Accumulate dQ of one query block over key blocks [start, end)."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    for start_n in range(start, end, BLOCK_N):
        k_idx = start_n + offs_n
        k = load_tile(k_base + k_idx[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                      k_idx, seqlen_k, offs_d, HEAD_DIM, MASK, BLOCK_D != HEAD_DIM, UPCAST)
        v = load_tile(v_base + k_idx[:, None] * stride_vn + offs_dv[None, :] * stride_vd,
                      k_idx, seqlen_k, offs_dv, HEAD_DIM_V, MASK, BLOCK_DV != HEAD_DIM_V, UPCAST)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BM, BN)
        s2, t = score_tile(qk, q_idx[:, None], k_idx[None, :], diag, seqlen_k, sm_scale, softcap,
                           slope2, window_left, window_right, SOFTCAP, ALIBI, MASK, WINDOW)
        p = tl.exp2(s2 - lse2[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)  # (BM, BN)
        if DROPOUT:
            keep = dropout_keep(seed, batch_g, head_g, q_start + q_idx[:, None],
                                kv_start + k_idx[None, :], drop_threshold)
            dp = tl.where(keep, dp * drop_scale, 0.0)
        ds = p * (dp - delta[:, None])
        if SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    return dq


@triton.jit(**specialization("_bwd_dq"))
def _bwd_dq(q_ptr, k_ptr, v_ptr, dout_ptr, lse_ptr, delta_ptr, dq_ptr, slopes_ptr, cu_q_ptr,
            cu_k_ptr, place_ptr,
            stride_qb, stride_qh, stride_qm, stride_qd,
            stride_kb, stride_kh, stride_kn, stride_kd,
            stride_vb, stride_vh, stride_vn, stride_vd,
            stride_dob, stride_doh, stride_dom, stride_dod,
            stride_dqb, stride_dqh, stride_dqm, stride_dqd,
            heads_q, group_size, seqlen_q, seqlen_k, diag, sm_scale, softcap, window_left,
            window_right, seed, drop_threshold, drop_scale, q_start, kv_start, head_start,
            batch_start,
            HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_D: tl.constexpr,
            BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
            DROPOUT: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
            VARLEN: tl.constexpr):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)  # heaviest (causal: last) blocks first
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
    row = (tensor_b * heads_q + head).to(tl.int64) * total_q + q_off

    m_lo = pid_m * BLOCK_M
    q_idx = m_lo + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q_base = (q_ptr + tensor_b.to(tl.int64) * stride_qb + head.to(tl.int64) * stride_qh
              + q_off.to(tl.int64) * stride_qm)
    do_base = (dout_ptr + tensor_b.to(tl.int64) * stride_dob + head.to(tl.int64) * stride_doh
               + q_off.to(tl.int64) * stride_dom)
    k_base = (k_ptr + tensor_b.to(tl.int64) * stride_kb + head_kv.to(tl.int64) * stride_kh
              + k_off.to(tl.int64) * stride_kn)
    v_base = (v_ptr + tensor_b.to(tl.int64) * stride_vb + head_kv.to(tl.int64) * stride_vh
              + k_off.to(tl.int64) * stride_vn)
    q = load_tile(q_base + q_idx[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                  q_idx, seqlen_q, offs_d, HEAD_DIM, True, BLOCK_D != HEAD_DIM, UPCAST)
    do = load_tile(do_base + q_idx[:, None] * stride_dom + offs_dv[None, :] * stride_dod,
                   q_idx, seqlen_q, offs_dv, HEAD_DIM_V, True, BLOCK_DV != HEAD_DIM_V, UPCAST)
    lse = tl.load(lse_ptr + row + q_idx, mask=q_idx < seqlen_q, other=float("inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse) * LOG2E  # no key seen: P = 0
    delta = tl.load(delta_ptr + row + q_idx, mask=q_idx < seqlen_q, other=0.0)
    slope2 = 0.0
    if ALIBI:
        slope2 = tl.load(slopes_ptr + head)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    start, full_start, full_end, end = key_ranges(
        m_lo, tl.minimum(m_lo + BLOCK_M, seqlen_q), diag, seqlen_k, window_left, window_right,
        BLOCK_N, WINDOW)
    if VARLEN:  # a query block past this sequence's end: no keys to visit
        live = m_lo < seqlen_q
        full_start = tl.where(live, full_start, start)
        full_end = tl.where(live, full_end, start)
        end = tl.where(live, end, start)
    dq = _dq_key_range(dq, q, do, lse2, delta, q_idx, k_base, v_base, stride_kn, stride_kd,
                       stride_vn, stride_vd, start, full_start, seqlen_k, diag, sm_scale, softcap,
                       slope2, window_left, window_right, seed, batch_g, head_g, q_start,
                       kv_start, drop_threshold, drop_scale, HEAD_DIM, HEAD_DIM_V, BLOCK_D,
                       BLOCK_DV, BLOCK_N, True, WINDOW, SOFTCAP, ALIBI, DROPOUT, UPCAST,
                       DOT_PRECISION)
    dq = _dq_key_range(dq, q, do, lse2, delta, q_idx, k_base, v_base, stride_kn, stride_kd,
                       stride_vn, stride_vd, full_start, full_end, seqlen_k, diag, sm_scale,
                       softcap, slope2, window_left, window_right, seed, batch_g, head_g,
                       q_start, kv_start, drop_threshold, drop_scale, HEAD_DIM, HEAD_DIM_V,
                       BLOCK_D, BLOCK_DV, BLOCK_N, False, WINDOW, SOFTCAP, ALIBI, DROPOUT,
                       UPCAST, DOT_PRECISION)
    dq = _dq_key_range(dq, q, do, lse2, delta, q_idx, k_base, v_base, stride_kn, stride_kd,
                       stride_vn, stride_vd, full_end, end, seqlen_k, diag, sm_scale, softcap,
                       slope2, window_left, window_right, seed, batch_g, head_g, q_start,
                       kv_start, drop_threshold, drop_scale, HEAD_DIM, HEAD_DIM_V, BLOCK_D,
                       BLOCK_DV, BLOCK_N, True, WINDOW, SOFTCAP, ALIBI, DROPOUT, UPCAST,
                       DOT_PRECISION)

    dq = dq * sm_scale
    dq_base = (dq_ptr + tensor_b.to(tl.int64) * stride_dqb + head.to(tl.int64) * stride_dqh
               + q_off.to(tl.int64) * stride_dqm)
    tl.store(dq_base + q_idx[:, None] * stride_dqm + offs_d[None, :] * stride_dqd,
             dq.to(dq_ptr.dtype.element_ty),
             mask=(q_idx[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM))


_AUTOTUNE_KEY = ["seqlen_q", "seqlen_k", "HEAD_DIM", "HEAD_DIM_V", "WINDOW", "SOFTCAP", "ALIBI",
                 "DROPOUT", "VARLEN"]
_bwd_dkdv_tuned = triton.autotune(configs=configs.BWD_DKDV_CONFIGS, key=_AUTOTUNE_KEY,
                                  prune_configs_by={"early_config_prune": configs.prune_bwd_dkdv},
                                  **configs.AUTOTUNE_CACHE)(_bwd_dkdv)
_bwd_dq_tuned = triton.autotune(configs=configs.BWD_DQ_CONFIGS, key=_AUTOTUNE_KEY,
                                prune_configs_by={"early_config_prune": configs.prune_bwd_dq},
                                **configs.AUTOTUNE_CACHE)(_bwd_dq)

PREPROCESS_BLOCK_M = 64  # rows per program of the delta pass: memory-bound, any size will do
# Triton's defaults for the rest (4 warps; 3 stages on CUDA, nothing to pipeline here)
PREPROCESS_CONFIG = {"BLOCK_M": PREPROCESS_BLOCK_M, "BLOCK_N": 0, "num_warps": 4, "num_stages": 3}


def backward_args(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, dout: torch.Tensor, params: FlashParams, *, interpreted: bool):
    """Allocate delta (B, Hq, Sq) and dq, dk, dv; return them with the keyword arguments of the
    three kernels (everything but the tile sizes of dK/dV and dQ). Works on meta tensors."""
    batch, heads_q, seqlen_q, head_dim = q.shape
    _, heads_kv, seqlen_k, head_dim_v = v.shape
    flags = params.kernel_flags(q.dtype, head_dim, head_dim_v, interpreted=interpreted)
    delta = torch.empty((batch, heads_q, seqlen_q), dtype=torch.float32, device=q.device)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    preprocess = dict(
        out_ptr=out, dout_ptr=dout, delta_ptr=delta, **strides("o", out, "m"),
        **strides("do", dout, "m"), heads_q=heads_q, seqlen_q=seqlen_q,
        HEAD_DIM_V=head_dim_v, BLOCK_DV=flags["BLOCK_DV"], BLOCK_M=PREPROCESS_BLOCK_M,
        UPCAST=interpreted)
    common = dict(
        q_ptr=q, k_ptr=k, v_ptr=v, dout_ptr=dout, lse_ptr=lse.contiguous(), delta_ptr=delta,
        slopes_ptr=params.slopes_log2(q.device, heads_q), **params.cu_tensors(q.device),
        **strides("q", q, "m"), **strides("k", k, "n"), **strides("v", v, "n"),
        **strides("do", dout, "m"), heads_q=heads_q, group_size=heads_q // heads_kv,
        seqlen_q=seqlen_q, seqlen_k=seqlen_k, **params.kernel_scalars(), **flags)
    dkdv = dict(common, dk_ptr=dk, dv_ptr=dv, heads_kv=heads_kv,
                **strides("dk", dk, "n"), **strides("dv", dv, "n"))
    dq_args = dict(common, dq_ptr=dq, **strides("dq", dq, "m"))
    return (dq, dk, dv), {"preprocess": preprocess, "dkdv": dkdv, "dq": dq_args}


def flash_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, dout: torch.Tensor, params: FlashParams,
                   dkdv_config: "configs.BlockConfig | None" = None,
                   dq_config: "configs.BlockConfig | None" = None,
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the three backward kernels; return (dq, dk, dv) in q's dtype. Pure: may be called
    any number of times on the same forward results. Configs as in
    :func:`attnbench.kernels.flash_fwd.flash_forward`."""
    batch, heads_q, seqlen_q, _ = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    interpreted = is_interpreted(_bwd_dkdv)
    grads, args = backward_args(q, k, v, out, lse, dout, params, interpreted=interpreted)
    _bwd_preprocess[(triton.cdiv(seqlen_q, PREPROCESS_BLOCK_M), batch * heads_q)](
        **args["preprocess"], num_warps=PREPROCESS_CONFIG["num_warps"],
        num_stages=PREPROCESS_CONFIG["num_stages"])  # row-wise: a pack is rows like any other
    note_launch("_bwd_preprocess", PREPROCESS_CONFIG)
    # Packed: one program row per (sequence, head), blocks for the longest sequence.
    seqlen_q, q_rows = params.grid_rows(batch, seqlen_q, heads_q)
    seqlen_k, kv_rows = params.grid_rows(batch, seqlen_k, heads_kv, keys=True)
    launch_tiled(_bwd_dkdv, _bwd_dkdv_tuned, "bwd_dkdv",
                 lambda block_m, block_n: (triton.cdiv(seqlen_k, block_n), kv_rows), args["dkdv"],
                 interpreted=interpreted, config=dkdv_config,
                 interpreter_config=configs.INTERPRETER_BWD_DKDV)
    launch_tiled(_bwd_dq, _bwd_dq_tuned, "bwd_dq",
                 lambda block_m, block_n: (triton.cdiv(seqlen_q, block_m), q_rows), args["dq"],
                 interpreted=interpreted, config=dq_config,
                 interpreter_config=configs.INTERPRETER_BWD_DQ)
    return grads
