"""One work model for every backend: FLOPs and the minimal memory traffic of one call.

Forward FLOPs = 2 * B * Hq * visible_pairs * (D + Dv): one multiply-add per element for
Q @ K^T and for P @ V, over the (query, key) pairs the mask lets through (causal, windows and
Sq != Sk counted exactly, not halved). Backward = 2 * B * Hq * visible_pairs * (3D + 2Dv): the
recomputed Q @ K^T (D), dV = P^T dO (Dv), dP = dO V^T (Dv), dQ = dS K (D) and dK = dS^T Q (D) --
2.5 x forward when D == Dv (the FlashAttention papers' convention), exact otherwise. GQA does not
change the FLOPs (every query head still does its matmuls); it changes the bytes.

Bytes: what a fused kernel must move at the least -- every input read once, every output
written once, in the case's dtype, plus the fp32 log-sum-exp (written by forward, read by
backward). Achieved GB/s against it is the meaningful figure where FLOPs are few (decode, short
sequences).

Decode (forward only, memory-bound): the keys some query can see are read once from the cache
(all of them unless a window leaves old ones out), q read, out written, and a paged cache's
block table read (int32 per page); no log-sum-exp is written (flash_attn_with_kvcache returns
none unless asked). Pages are counted by the tokens in them, not whole pages.
"""

from __future__ import annotations

from attnbench.dtypes import BY_NAME
from attnbench.sweep.case import Case

BACKWARD_FACTOR = 2.5
"""Backward / forward FLOPs when head_dim == head_dim_v: 2.0 (bwd) + 0.5 (recompute)."""
LSE_BYTES = 4  # float32 per query row and head


def visible_pairs(seqlen_q: int, seqlen_kv: int, window_left: int, window_right: int) -> int:
    """Number of (query, key) pairs visible under a window band (-1 = unbounded), with
    queries aligned bottom-right. Exact, O(Sq) in pure Python arithmetic."""
    if window_left < 0 and window_right < 0:
        return seqlen_q * seqlen_kv
    offset = seqlen_kv - seqlen_q
    total = 0
    for i in range(seqlen_q):
        diag = i + offset
        lo = 0 if window_left < 0 else max(0, diag - window_left)
        hi = seqlen_kv - 1 if window_right < 0 else min(seqlen_kv - 1, diag + window_right)
        if hi >= lo:
            total += hi - lo + 1
    return total


def case_pairs(case: Case) -> int:
    """Visible (query, key) pairs of one head over the whole case: for a packed case the sum
    over its sequences (each with its own bottom-right alignment; none across sequences)."""
    if case.is_packed:
        return sum(visible_pairs(lq, lk, *case.window_bounds)
                   for lq, lk in zip(case.seqlens_q, case.seqlens_kv))
    return case.batch * visible_pairs(case.seqlen_q, case.seqlen_kv, *case.window_bounds)


def case_flops(case: Case) -> tuple[float, float]:
    """(forward, backward) FLOPs of one call on the whole (unsplit) case."""
    pairs = 2.0 * case.heads_q * case_pairs(case)
    d, dv = case.head_dim, case.head_dim_v
    return pairs * (d + dv), pairs * (3 * d + 2 * dv)


def cache_keys_read(seqlen_q: int, seqlen_kv: int, window_left: int) -> int:
    """Keys of one sequence's cache some query can see (queries aligned bottom-right): a
    window's left bound leaves out the keys before the first query's window."""
    first = seqlen_kv - seqlen_q  # key position of query 0
    return seqlen_kv - (max(0, first - window_left) if window_left >= 0 else 0)


def decode_bytes(case: Case) -> float:
    """Forward bytes of a decode call: cache keys read once (each sequence's own length), q,
    out, the block table (its columns of every sequence)."""
    size = BY_NAME[case.dtype].bytes
    left, _ = case.window_bounds
    pairs = (list(zip(case.seqlens_q, case.seqlens_kv)) if case.is_packed
             else [(case.seqlen_q, case.seqlen_kv)] * case.batch)
    keys = case.heads_kv * sum(cache_keys_read(q, k, left) for q, k in pairs)
    queries = case.heads_q * sum(q for q, _ in pairs)
    longest = max(k for _, k in pairs)
    table = case.batch * -(-longest // case.page_size) * 4 if case.page_size else 0
    return float((queries * case.head_dim + keys * (case.head_dim + case.head_dim_v)
                  + queries * case.head_dim_v) * size + table)


def case_bytes(case: Case) -> tuple[float, float]:
    """(forward, backward) bytes of the minimal traffic of one call on the whole case."""
    if case.decode:
        return decode_bytes(case), 0.0
    dtype = BY_NAME[case.dtype]
    size = dtype.bytes
    b, sq, sk = case.tensor_batch, case.seqlen_q, case.seqlen_kv  # packed: b=1, total tokens
    q = b * case.heads_q * sq * case.head_dim
    k = b * case.heads_kv * sk * case.head_dim
    v = b * case.heads_kv * sk * case.head_dim_v
    o = b * case.heads_q * sq * case.head_dim_v
    lse = b * case.heads_q * sq * LSE_BYTES
    out_size = BY_NAME[dtype.output].bytes  # fp8: the output dtype's (attnbench.dtypes)
    forward = (q + k + v) * size + o * out_size + lse      # read q, k, v; write out, lse
    backward = (2 * (q + k + v) + 2 * o) * size + lse      # read q, k, v, out, dout, lse;
    return float(forward), float(backward)                 # write dq, dk, dv
