"""Split-KV decode (flash-decoding): a few new queries against a long, possibly paged, KV cache.

Legend: B = batch, Hq / Hkv = query / key-value heads, G = Hq / Hkv, Sq = new tokens (1..16),
Sk = cache length (per sequence: ``seqlens_k``), D / DV = head dims, S = splits, T = page size,
R = G * Sq query rows that share one kv head, BM / BN = BLOCK_M / BLOCK_N.
q (B, Hq, Sq, D); a contiguous cache k (B, Hkv, Sk, D), v (B, Hkv, Sk, DV), or a paged one
k_pages (P, T, Hkv, D), v_pages (P, T, Hkv, DV) with block_table (B, N) int32
(:mod:`attnbench.problem.paged`); out (B, Hq, Sq, DV) in q's dtype, lse (B, Hq, Sq) float32.

Decode reads the whole cache for a handful of queries: it is memory-bound, and one program
per (batch, head) would leave most of a GPU idle. So (1) the R rows of a GQA group are one
tile (the kv head's keys are read once for all of them, not G times), and (2) the cache is
split across S programs, each writing a partial output normalised by its own softmax and its
log-sum-exp; :func:`_merge_splits` combines them with weights exp(lse_s - max_s lse_s) -- the
max keeps exp() in range whatever the logits. Queries sit at the cache's last positions
(bottom-right): query i of sequence b is at key position seqlens_k[b] - Sq + i.
"""

import torch
import triton
import triton.language as tl

from attnbench.kernels.common import LN2, score_tile, specialization
from attnbench.kernels.compile_watch import note_launch
from attnbench.kernels.params import FlashParams, is_interpreted, padded_head_dim, triton_next_power_of_2


@triton.jit(**specialization("_decode_split"))
def _decode_split(q_ptr, k_ptr, v_ptr, table_ptr, seqlens_ptr, slopes_ptr, out_part_ptr,
                  lse_part_ptr,
                  stride_qb, stride_qh, stride_qm, stride_qd,
                  stride_kb, stride_kh, stride_kn, stride_kd,
                  stride_vb, stride_vh, stride_vn, stride_vd,
                  stride_tb, heads_kv, seqlen_q, rows, num_splits, sm_scale, softcap,
                  window_left, window_right,
                  GROUP: tl.constexpr, PAGE_SIZE: tl.constexpr,
                  HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
                  UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One split of one (batch, kv head, row block): online softmax over its keys.

    Paged (PAGE_SIZE > 0): k_ptr / v_ptr are the page pools and stride_kb / stride_vb their
    page strides, stride_kn / stride_vn the slot strides; key t is in slot t % T of page
    table[b, t // T]. Contiguous: stride_kb is the batch stride, stride_kn the token stride."""
    split = tl.program_id(0)
    pid_bh = tl.program_id(1)
    batch = pid_bh // heads_kv
    head_kv = pid_bh % heads_kv
    row = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = row < rows
    head = head_kv * GROUP + row // seqlen_q          # query head of each row
    q_idx = row % seqlen_q                             # new token of each row
    seqlen_k = tl.load(seqlens_ptr + batch)
    diag = seqlen_k - seqlen_q                         # key position of query 0

    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q_ptrs = (q_ptr + batch.to(tl.int64) * stride_qb + head[:, None].to(tl.int64) * stride_qh
              + q_idx[:, None] * stride_qm + offs_d[None, :] * stride_qd)
    q = tl.load(q_ptrs, mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    slope2 = tl.zeros([BLOCK_M, 1], dtype=tl.float32)
    if ALIBI:
        slope2 = tl.load(slopes_ptr + head, mask=row_ok, other=0.0)[:, None]

    # This split's keys: an equal, BN-aligned share of the keys some query can see.
    first = 0
    if WINDOW:
        first = tl.maximum(diag - window_left, 0)
    chunk = tl.cdiv(tl.cdiv(tl.maximum(seqlen_k - first, 0), num_splits), BLOCK_N) * BLOCK_N
    lo = first + split * chunk
    hi = tl.minimum(lo + chunk, seqlen_k)

    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        k_idx = start_n + offs_n
        k_ok = k_idx < hi
        if PAGE_SIZE > 0:
            page = tl.load(table_ptr + batch.to(tl.int64) * stride_tb + k_idx // PAGE_SIZE,
                           mask=k_ok, other=0).to(tl.int64)
            k_row = page * stride_kb + (k_idx % PAGE_SIZE) * stride_kn
            v_row = page * stride_vb + (k_idx % PAGE_SIZE) * stride_vn
        else:
            k_row = batch.to(tl.int64) * stride_kb + k_idx.to(tl.int64) * stride_kn
            v_row = batch.to(tl.int64) * stride_vb + k_idx.to(tl.int64) * stride_vn
        k = tl.load(k_ptr + head_kv.to(tl.int64) * stride_kh + k_row[:, None]
                    + offs_d[None, :] * stride_kd,
                    mask=k_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
        v = tl.load(v_ptr + head_kv.to(tl.int64) * stride_vh + v_row[:, None]
                    + offs_dv[None, :] * stride_vd,
                    mask=k_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V), other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)      # (BM, BN) fp32
        # Keys at or past hi (this split's end, or the sequence's) count as past its end.
        s2, _ = score_tile(qk, q_idx[:, None], k_idx[None, :], diag, hi, sm_scale, softcap,
                           slope2, window_left, window_right, SOFTCAP, ALIBI, True, WINDOW)
        m_new = tl.maximum(m_i, tl.max(s2, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw no key yet
        p = tl.exp2(s2 - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new

    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(seen, (m_i + tl.log2(l_safe)) * LN2, float("-inf"))
    part = (pid_bh * num_splits + split).to(tl.int64) * rows
    tl.store(out_part_ptr + (part + row[:, None]) * HEAD_DIM_V + offs_dv[None, :], out,
             mask=row_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V))
    tl.store(lse_part_ptr + part + row, lse, mask=row_ok)


@triton.jit(**specialization("_merge_splits"))
def _merge_splits(out_part_ptr, lse_part_ptr, out_ptr, lse_ptr,
                  stride_ob, stride_oh, stride_om, stride_od, heads_kv, seqlen_q, rows,
                  num_splits, GROUP: tl.constexpr, BLOCK_S: tl.constexpr,
                  HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr):
    """Combine the S partial results of one (batch, kv head, row block): weights
    exp(lse_s - max lse), so exp() never overflows; rows no split saw: out 0, lse -inf."""
    pid_bh = tl.program_id(0)
    batch = pid_bh // heads_kv
    head_kv = pid_bh % heads_kv
    row = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = row < rows
    offs_s = tl.arange(0, BLOCK_S)
    offs_dv = tl.arange(0, BLOCK_DV)
    part = (pid_bh * num_splits + offs_s).to(tl.int64) * rows             # (BS,)
    lse_s = tl.load(lse_part_ptr + part[:, None] + row[None, :],
                    mask=(offs_s[:, None] < num_splits) & row_ok[None, :],
                    other=float("-inf"))                                   # (BS, BM)
    m = tl.max(lse_s, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp(lse_s - m_safe[None, :])                                    # (BS, BM)
    total = tl.sum(w, 0)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    for s in range(num_splits):
        o = tl.load(out_part_ptr + ((pid_bh * num_splits + s).to(tl.int64) * rows
                                    + row[:, None]) * HEAD_DIM_V + offs_dv[None, :],
                    mask=row_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V), other=0.0)
        w_s = tl.sum(tl.where(offs_s[:, None] == s, w, 0.0), 0)            # (BM,)
        acc += o * w_s[:, None]
    seen = total > 0.0
    t_safe = tl.where(seen, total, 1.0)
    out = acc / t_safe[:, None]
    lse = tl.where(seen, m_safe + tl.log(t_safe), float("-inf"))
    head = head_kv * GROUP + row // seqlen_q
    q_idx = row % seqlen_q
    o_ptrs = (out_ptr + batch.to(tl.int64) * stride_ob + head[:, None].to(tl.int64) * stride_oh
              + q_idx[:, None] * stride_om + offs_dv[None, :] * stride_od)
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V))
    tl.store(lse_ptr + (batch * heads_kv * GROUP + head).to(tl.int64) * seqlen_q + q_idx, lse,
             mask=row_ok)


DECODE_LAUNCH = {"num_warps": 4, "num_stages": 3}
"""Both decode kernels: one warpgroup (the row tile is at most 64 rows) and Triton's default
pipeline depth on CUDA. Their tiles follow the call (decode_args), not a tuning space: decode
is one config per kernel in every mode."""


def merge_splits_torch(out_part: torch.Tensor, lse_part: torch.Tensor,
                       dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_merge_splits` in torch (tests compare the two; mutants edit this one).
    out_part (..., S, R, DV) float32, lse_part (..., S, R) -> out (..., R, DV) in ``dtype``,
    lse (..., R) float32."""
    m = lse_part.amax(-2, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w = torch.exp(lse_part - m)
    total = w.sum(-2)
    out = (out_part * w[..., None]).sum(-3) / total.clamp_min(1e-30)[..., None]
    lse = torch.where(total > 0, m.squeeze(-2) + torch.log(total), float("-inf"))
    return out.to(dtype), lse


def num_splits(batch_heads: int, row_blocks: int, seqlen_k: int, block_n: int,
               interpreted: bool) -> int:
    """Splits of the cache: on a GPU enough programs to fill it (~2 per SM of a 132-SM H100)
    with at least two key blocks each; in the interpreter up to 4, so merging is exercised
    even at test sizes."""
    blocks = triton.cdiv(seqlen_k, block_n)
    if interpreted:
        return max(1, min(4, blocks))
    wanted = triton.cdiv(264, max(1, batch_heads * row_blocks))
    return max(1, min(wanted, triton.cdiv(blocks, 2), 128))


def decode_args(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: FlashParams, *,
                seqlens_k: torch.Tensor, max_seqlen_k: int, heads_kv: int, block_table=None,
                page_size: int = 0, splits: int = 0, interpreted: bool) -> dict:
    """Allocate the partial results and the outputs; return them with both kernels' keyword
    arguments and grids. Works on meta tensors too (:mod:`attnbench.kernels.compile_check`)."""
    batch, heads_q, seqlen_q, head_dim = q.shape
    head_dim_v = v.shape[-1]
    group = heads_q // heads_kv
    rows = group * seqlen_q
    block_m = max(16, min(64, triton_next_power_of_2(rows)))
    block_n = 16 if interpreted else 64
    row_blocks = triton.cdiv(rows, block_m)
    splits = splits or num_splits(batch * heads_kv, row_blocks, max_seqlen_k, block_n,
                                  interpreted)
    device = q.device
    out_part = torch.empty((batch, heads_kv, splits, rows, head_dim_v), dtype=torch.float32,
                           device=device)
    lse_part = torch.empty((batch, heads_kv, splits, rows), dtype=torch.float32, device=device)
    out = torch.empty((batch, heads_q, seqlen_q, head_dim_v), dtype=q.dtype, device=device)
    lse = torch.empty((batch, heads_q, seqlen_q), dtype=torch.float32, device=device)
    if block_table is None:
        (kb, kh, kn, kd), (vb, vh, vn, vd) = k.stride(), v.stride()
        table, stride_tb = seqlens_k, 0  # a placeholder pointer, never read
    else:  # pools (P, T, Hkv, *): page, slot, head, dim
        (kb, kn, kh, kd), (vb, vn, vh, vd) = k.stride(), v.stride()
        table, stride_tb = block_table, block_table.stride(0)
    flags = params.kernel_flags(q.dtype, head_dim, head_dim_v, interpreted=interpreted)
    scalars = params.kernel_scalars()
    qb, qh, qm, qd = q.stride()
    split = dict(
        q_ptr=q, k_ptr=k, v_ptr=v, table_ptr=table, seqlens_ptr=seqlens_k,
        slopes_ptr=params.slopes_log2(device, heads_q), out_part_ptr=out_part,
        lse_part_ptr=lse_part, stride_qb=qb, stride_qh=qh, stride_qm=qm, stride_qd=qd,
        stride_kb=kb, stride_kh=kh, stride_kn=kn, stride_kd=kd, stride_vb=vb, stride_vh=vh,
        stride_vn=vn, stride_vd=vd, stride_tb=stride_tb, heads_kv=heads_kv, seqlen_q=seqlen_q,
        rows=rows, num_splits=splits, sm_scale=scalars["sm_scale"], softcap=scalars["softcap"],
        window_left=scalars["window_left"], window_right=scalars["window_right"],
        GROUP=group, PAGE_SIZE=page_size, HEAD_DIM=head_dim,
        HEAD_DIM_V=head_dim_v, BLOCK_D=flags["BLOCK_D"], BLOCK_DV=flags["BLOCK_DV"],
        BLOCK_M=block_m, BLOCK_N=block_n, WINDOW=flags["WINDOW"], SOFTCAP=flags["SOFTCAP"],
        ALIBI=flags["ALIBI"], UPCAST=flags["UPCAST"], DOT_PRECISION=flags["DOT_PRECISION"])
    ob, oh, om, od = out.stride()
    merge = dict(
        out_part_ptr=out_part, lse_part_ptr=lse_part, out_ptr=out, lse_ptr=lse, stride_ob=ob,
        stride_oh=oh, stride_om=om, stride_od=od, heads_kv=heads_kv, seqlen_q=seqlen_q,
        rows=rows, num_splits=splits, GROUP=group, BLOCK_S=triton_next_power_of_2(splits),
        HEAD_DIM_V=head_dim_v, BLOCK_DV=padded_head_dim(head_dim_v), BLOCK_M=block_m)
    return dict(split=split, split_grid=(splits, batch * heads_kv, row_blocks), merge=merge,
                merge_grid=(batch * heads_kv, row_blocks), out=out, lse=lse,
                shape=(batch, heads_q, seqlen_q, head_dim_v))


def decode_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: FlashParams, *,
                   seqlens_k: torch.Tensor, max_seqlen_k: int, heads_kv: int, block_table=None,
                   page_size: int = 0, merge=None, splits: int = 0
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the split and merge kernels; return out (B, Hq, Sq, DV) in q's dtype and lse
    (B, Hq, Sq) float32 (natural log, -inf for rows that see no key).

    k / v: (B, Hkv, Sk, *) contiguous, or with ``block_table`` (B, N) int32 and
    ``page_size`` the page pools (P, T, Hkv, *). ``seqlens_k`` (B,) int32 on the device: keys
    in each sequence's cache, at most ``max_seqlen_k`` (a host int: reading the tensor's max
    would sync inside the timed call). ``merge``: a torch function replacing the merge kernel
    (:func:`merge_splits_torch`'s signature); ``splits``: force the split count."""
    launch = decode_args(q, k, v, params, seqlens_k=seqlens_k, max_seqlen_k=max_seqlen_k,
                         heads_kv=heads_kv, block_table=block_table, page_size=page_size,
                         splits=splits, interpreted=is_interpreted(_decode_split))
    split = launch["split"]
    _decode_split[launch["split_grid"]](**split, **DECODE_LAUNCH)
    note_launch("_decode_split", dict(BLOCK_M=split["BLOCK_M"], BLOCK_N=split["BLOCK_N"],
                                      **DECODE_LAUNCH))
    if merge is None:
        _merge_splits[launch["merge_grid"]](**launch["merge"], **DECODE_LAUNCH)
        note_launch("_merge_splits", dict(BLOCK_M=launch["merge"]["BLOCK_M"],  # its "BLOCK_N":
                                          BLOCK_N=launch["merge"]["BLOCK_S"],  # the splits tile
                                          **DECODE_LAUNCH))
        return launch["out"], launch["lse"]
    batch, heads_q, seqlen_q, head_dim_v = launch["shape"]
    out_rows, lse_rows = merge(split["out_part_ptr"], split["lse_part_ptr"], q.dtype)
    return (out_rows.reshape(batch, heads_q, seqlen_q, head_dim_v),       # rows (g, i) of a
            lse_rows.reshape(batch, heads_q, seqlen_q))                   # kv head = (h, i)
