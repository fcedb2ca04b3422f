"""Device functions shared by the forward and backward kernels: scores, masks, dropout, tanh.

Legend: BM = BLOCK_M (query rows of a tile), BN = BLOCK_N (key rows), D / DV = head dims.
Indices inside the kernels are *local* to this call (0 .. Sq-1, 0 .. Sk-1). Two numbers connect
them to the global problem of :mod:`attnbench.problem.attn_spec`:

* ``diag`` = q_start + (Sk_total - Sq_total) - kv_start: local query ``i`` sits at local key
  position ``i + diag`` (bottom-right alignment), so key ``j`` is visible iff
  ``-window_left <= j - (i + diag) <= window_right`` and the ALiBi distance is ``|i + diag - j|``;
  both are the same in local and global coordinates.
* ``q_start`` / ``kv_start`` / ``head_start`` / ``batch_start`` turn local indices into the global
  ones the dropout random numbers are keyed by.

Scores are kept in log2 units (``s * LOG2E``) so that softmax uses ``exp2``, the native instruction.
"""

import triton
import triton.language as tl

# Globals a kernel reads must be tl.constexpr (compiled Triton refuses plain Python globals; the
# interpreter does not check). Host code reads ``.value``.
LOG2E = tl.constexpr(1.4426950408889634)  # 1 / ln(2): exp(x) == exp2(x * LOG2E)
LN2 = tl.constexpr(0.6931471805599453)  # ln(2): natural-log lse == log2-units lse * LN2

UNBOUNDED = 1 << 30
"""Window bound standing in for "no bound": larger than any supported sequence (2^30 tokens),
small enough that ``index + UNBOUNDED`` cannot overflow int32."""

_SLICE = ("diag", "window_left", "window_right", "seed", "drop_threshold", "q_start", "kv_start",
          "head_start", "batch_start")
_FLASH = ("heads_q", "seqlen_q", "seqlen_k") + _SLICE
# fp8 descales (rows, Hkv): per tensor a stride-0 broadcast, per head (Hkv, 1) -- one scalar
# read per program, so their strides need no hint, and MQA's unit stride no kernel of its own
_DESCALE_STRIDES = tuple(f"stride_d{x}{d}" for x in "qkv" for d in "bh")
RUNTIME_INTS: dict[str, tuple[str, ...]] = {
    "_attn_fwd": _FLASH + _DESCALE_STRIDES,
    "_bwd_preprocess": ("heads_q", "seqlen_q"),
    "_bwd_dkdv": ("heads_kv",) + _FLASH,
    "_bwd_dq": _FLASH,
    "_decode_split": ("heads_kv", "seqlen_q", "rows", "num_splits", "window_left",
                      "window_right", "stride_tb"),
    "_merge_splits": ("heads_kv", "seqlen_q", "rows", "num_splits"),
    "_keep_mask_kernel": ("n_h", "n_i", "n_j", "seed", "threshold"),
}
"""Each kernel's ``do_not_specialize``: its integer arguments that are not strides -- lengths,
offsets, seeds, window bounds, head counts. By default Triton compiles a new kernel for every
integer argument that equals 1 or changes divisibility by 16, so lengths 8196 vs 8192 or 8 vs
16 heads would each compile the whole variant anew. What specialisation bought here is small
(the lse/delta row offsets lose a 16-divisibility hint: a vector of BLOCK_M floats per key
block, next to tiles of BLOCK_M x head_dim); it stays on the strides, where a unit stride is
what lets loads vectorise. ``stride_tb`` (decode) is the block table's row stride, which follows
the longest cache: it only indexes int32 page ids, read one per key. Checked against the JIT's
own binder in tests/kernels/test_compile_control.py."""
ALIGNMENT_FREE_INTS: dict[str, tuple[str, ...]] = {
    name: ("group_size",) for name in ("_attn_fwd", "_bwd_dkdv", "_bwd_dq")}
"""``do_not_specialize_on_alignment``: still a constant when 1, never a divisibility hint. The
GQA group: MHA (1) compiles apart from GQA, because dK/dV's loop over a group's query heads
vanishes at 1 -- kept at run time it spills (sm_90, bf16 d128, 32 x 128 tile: 0 -> 200 B
under triton 3.9, 8 -> 320 B packed; compile_check) -- but a group of 16 vs 4 compiles once."""


def specialization(kernel: str) -> dict[str, tuple[str, ...]]:
    """``@triton.jit`` keywords of ``kernel``: what it does not specialise on."""
    return {"do_not_specialize": RUNTIME_INTS[kernel],
            "do_not_specialize_on_alignment": ALIGNMENT_FREE_INTS.get(kernel, ())}


@triton.jit
def tanh(x):
    """tanh to a few fp32 ulps, from exp and log (libdevice's tanh does not exist under
    TRITON_INTERPRET=1; one code path keeps what CI checks identical to what the GPU runs).

    tanh|x| = -m / (2 + m) with m = expm1(-2|x|), and expm1 by Kahan's trick
    (u - 1) * y / log(u), u = e^y: the plain 1 - e^(-2|x|) cancels near 0 and cost softcap cases
    ~10x the error of torch.tanh in fp32.
    """
    y = -2.0 * tl.abs(x)
    u = tl.exp(y)
    exact = (u == 1.0) | (u == 0.0)  # expm1 = y (tiny |y|) or -1 (e^y underflowed)
    m = (u - 1.0) * y / tl.log(tl.where(exact, 0.5, u))
    m = tl.where(u == 1.0, y, tl.where(u == 0.0, -1.0, m))
    t = -m / (2.0 + m)
    return tl.where(x < 0, -t, t)


@triton.jit
def dropout_keep(seed, batch, head, q_pos, k_pos, threshold):
    """Keep-mask (True = kept) for global (batch, query head, query, key) positions.

    One Philox-4x32-10 draw per element with the 128-bit counter (key, query, head, batch), all
    global indices, and the 64-bit key ``seed``: a pure function of the position, so every
    kernel (forward, dK/dV, dQ), the mask materializer and any context-parallel split draw the
    same number for the same element. ``q_pos`` (BM, 1) / (1, BM) and ``k_pos`` broadcast to the
    tile. An element is kept iff the top 31 bits of the first output word are >= ``threshold``
    = round(p * 2^31): integer arithmetic only, so :func:`attnbench.kernels.dropout.keep_mask_torch`
    reproduces it bit for bit.
    """
    k_full = (k_pos + 0 * q_pos).to(tl.uint32)
    q_full = (q_pos + 0 * k_pos).to(tl.uint32)
    zero = k_full * 0
    head_full = zero + head.to(tl.uint32)
    batch_full = zero + batch.to(tl.uint32)
    r0, _, _, _ = tl.philox(seed, k_full, q_full, head_full, batch_full)
    return (r0 >> 1).to(tl.int32) >= threshold


@triton.jit
def score_tile(qk, q_idx, k_idx, diag, seqlen_k, sm_scale, softcap, slope2, window_left,
               window_right, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, MASK: tl.constexpr,
               WINDOW: tl.constexpr):
    """Final scores of one tile in log2 units, -inf where the key is not visible.

    qk: raw q.k^T tile (fp32), either (BM, BN) with q_idx (BM, 1), k_idx (1, BN), or transposed.
    slope2: this head's ALiBi slope times LOG2E. MASK: apply the window and key-length masks
    (constexpr: tiles that are fully visible skip all of it). Returns (s2, t) where t is
    tanh(scale * qk / softcap) when SOFTCAP (the backward needs 1 - t^2) and qk otherwise.
    """
    if SOFTCAP:
        t = tanh(qk * (sm_scale / softcap))
        s2 = t * (softcap * LOG2E)
    else:
        t = qk
        s2 = qk * (sm_scale * LOG2E)
    if ALIBI:
        s2 = s2 - slope2 * tl.abs(q_idx + diag - k_idx).to(tl.float32)
    if MASK:
        visible = k_idx < seqlen_k
        if WINDOW:
            rel = k_idx - (q_idx + diag)
            visible = visible & (rel <= window_right) & (rel >= -window_left)
        s2 = tl.where(visible, s2, float("-inf"))
    return s2, t


@triton.jit
def load_tile(ptrs, rows, n_rows, cols, n_cols, CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr,
              UPCAST: tl.constexpr):
    """Load a (rows, cols) tile, zero outside the tensor; fp32 when UPCAST (the interpreter
    computes bf16 arithmetic on raw bits, so it must never see a bf16 value)."""
    if CHECK_ROWS and CHECK_COLS:
        x = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0)
    elif CHECK_ROWS:
        x = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
    elif CHECK_COLS:
        x = tl.load(ptrs, mask=cols[None, :] < n_cols, other=0.0)
    else:
        x = tl.load(ptrs)
    if UPCAST:
        x = x.to(tl.float32)
    return x


@triton.jit
def key_ranges(m_lo, m_hi, diag, seqlen_k, window_left, window_right, BLOCK_N: tl.constexpr,
               WINDOW: tl.constexpr):
    """Which key blocks query rows [m_lo, m_hi) visit (m_hi clamped to Sq), split by whether
    masks are needed.

    Returns block-aligned (start, full_start, full_end, end): keys in [start, full_start) and
    [full_end, end) need masking, keys in [full_start, full_end) are visible to every row of the
    tile and inside the sequence. The window bounds come as UNBOUNDED when absent.
    """
    lo = 0
    hi = seqlen_k
    full_lo = 0
    full_hi = seqlen_k
    if WINDOW:
        lo = tl.maximum(m_lo + diag - window_left, 0)
        hi = tl.minimum(m_hi - 1 + diag + window_right + 1, seqlen_k)
        full_lo = tl.maximum(m_hi - 1 + diag - window_left, 0)
        full_hi = tl.minimum(m_lo + diag + window_right + 1, seqlen_k)
    hi = tl.maximum(hi, lo)
    start = (lo // BLOCK_N) * BLOCK_N
    end = tl.cdiv(hi, BLOCK_N) * BLOCK_N
    full_start = tl.minimum(tl.maximum(tl.cdiv(full_lo, BLOCK_N) * BLOCK_N, start), end)
    full_end = tl.minimum(tl.maximum((full_hi // BLOCK_N) * BLOCK_N, full_start), end)
    return start, full_start, full_end, end


@triton.jit
def query_ranges(n_lo, n_hi, diag, seqlen_q, seqlen_k, window_left, window_right,
                 BLOCK_M: tl.constexpr, WINDOW: tl.constexpr):
    """Which query blocks see keys [n_lo, n_hi) (n_hi = n_lo + BLOCK_N, possibly past the
    sequence end): the transpose of :func:`key_ranges`.

    Query i sees key j iff j - window_right <= i + diag <= j + window_left. A key block that
    runs past the sequence end is masked against every query block (its padding keys must get
    -inf scores).
    """
    lo = 0
    hi = seqlen_q
    full_lo = 0
    full_hi = seqlen_q
    if WINDOW:
        lo = tl.maximum(n_lo - diag - window_right, 0)
        hi = tl.minimum(tl.minimum(n_hi, seqlen_k) - 1 - diag + window_left + 1, seqlen_q)
        full_lo = tl.maximum(n_hi - 1 - diag - window_right, 0)
        full_hi = tl.minimum(n_lo - diag + window_left + 1, seqlen_q)
    full_hi = tl.where(n_hi > seqlen_k, 0, full_hi)
    hi = tl.maximum(hi, lo)
    start = (lo // BLOCK_M) * BLOCK_M
    end = tl.cdiv(hi, BLOCK_M) * BLOCK_M
    full_start = tl.minimum(tl.maximum(tl.cdiv(full_lo, BLOCK_M) * BLOCK_M, start), end)
    full_end = tl.minimum(tl.maximum((full_hi // BLOCK_M) * BLOCK_M, full_start), end)
    return start, full_start, full_end, end


@triton.jit
def sequence_of(batch, cu_q_ptr, cu_k_ptr, place_ptr, seqlen_q, seqlen_k, diag, q_start,
                kv_start, VARLEN: tl.constexpr):
    """Where program row ``batch`` reads:
    (q_off, k_off, seqlen_q, seqlen_k, diag, q_start, kv_start, tensor_b).

    Dense: batch ``batch`` of (B, H, S, D) tensors, offsets 0, the call's lengths, diagonal and
    global starts. Packed (``VARLEN``): sequence ``batch`` of the (1, H, T, D) buffers -- its
    first query and key rows from ``cu_seqlens``, its own lengths, and from ``place_ptr`` its
    own bottom-right diagonal and where this call's chunk of it starts in it (packed context
    parallelism; 0 for a whole sequence). A (B, H, S) row buffer (lse, delta) is indexed
    ``(tensor_b * heads + head) * total_q + q_off + i`` in both.
    """
    if VARLEN:
        q_off = tl.load(cu_q_ptr + batch)
        k_off = tl.load(cu_k_ptr + batch)
        seqlen_q = tl.load(cu_q_ptr + batch + 1) - q_off
        seqlen_k = tl.load(cu_k_ptr + batch + 1) - k_off
        diag = tl.load(place_ptr + 3 * batch)
        q_start = tl.load(place_ptr + 3 * batch + 1)
        kv_start = tl.load(place_ptr + 3 * batch + 2)
        tensor_b = batch * 0
    else:
        q_off = batch * 0
        k_off = batch * 0
        tensor_b = batch
    return q_off, k_off, seqlen_q, seqlen_k, diag, q_start, kv_start, tensor_b
