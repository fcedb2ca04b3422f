"""The attention problem one backend call solves, independent of how it is split.

Legend: B = batch, Hq / Hkv = query / key-value heads, Sq / Sk = query / key lengths of this call,
D / Dv = head dims. Tensors are (B, H, S, D).

An :class:`AttnSpec` says where this call's queries and keys sit in the *global* problem
(``q_start``, ``kv_start``, ``head_start``) so that masks, ALiBi and dropout are functions of
global positions. That is what lets a context-parallel or tensor-parallel run reproduce the
single-device result exactly, and lets the fp64 reference rebuild any backend's dropout mask.

Conventions (the same in every backend and the reference):

* scores = scale * q @ k^T, scale = 1/sqrt(D); then softcap (c * tanh(s / c)); then + ALiBi bias;
  then masked positions are -inf; softmax over keys; then dropout (keep / (1 - p)); then @ v.
* Queries are aligned bottom-right: global query i sits at key position i + Sk_total - Sq_total.
  Key j is visible to query i iff ``-window_left <= j - (i + Sk_total - Sq_total) <= window_right``
  (a negative window bound means unbounded); causal is ``window_right = 0``.
* A query row that sees no key outputs zeros and has log-sum-exp -inf (flash-attn's convention).
* ALiBi: bias[h, i, j] = -slope[h] * |i + Sk_total - Sq_total - j| with per-query-head slopes.
* Q head h uses K/V head h // (Hq / Hkv): groups are contiguous (HF ``repeat_kv``, flash-attn).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from attnbench.problem.packing import cu_seqlens

if TYPE_CHECKING:  # torch is imported lazily: the Dask worker process never needs it
    import torch

    from attnbench.sweep.case import Case


def alibi_slopes(num_heads: int) -> list[float]:
    """Per-head ALiBi slopes, as in the ALiBi paper and the HF/Megatron ``get_slopes``.

    For a power of two n: 2^(-8/n), 2^(-16/n), ... ; otherwise the slopes of the closest lower
    power of two, then every other slope of twice that many heads.
    """

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_two(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_two(closest) + power_of_two(2 * closest)[0::2][: num_heads - closest]


# A keep-mask provider returns the boolean keep mask (True = kept) for a block of the global
# problem: (batch indices, global q-head indices, global query positions, global key positions)
# -> bool tensor (len(b), len(h), len(i), len(j)). Backends that expose their dropout mask give
# the reference one of these; the default is :func:`attnbench.problem.dropout.hash_keep_mask`.
KeepMaskFn = Callable[["AttnSpec", "torch.Tensor", "torch.Tensor", "torch.Tensor", "torch.Tensor"],
                      "torch.Tensor"]


@dataclass(frozen=True, kw_only=True, slots=True)
class AttnSpec:
    """One backend call: the global problem's features plus where this call's slice sits."""

    scale: float
    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0
    alibi_slopes: Optional[tuple[float, ...]] = None
    """Slopes of the *global* query heads (indexed by global head number)."""
    dropout_p: float = 0.0
    dropout_seed: int = 0
    seqlen_q_total: int = 0
    seqlen_kv_total: int = 0
    q_start: int = 0
    kv_start: int = 0
    head_start: int = 0
    """Global index of this call's first query head (tensor parallelism)."""
    batch_start: int = 0
    cu_seqlens_q: tuple[int, ...] = ()
    """Packed case (:mod:`attnbench.problem.packing`): where each sequence's queries start in the
    one buffer of Sq tokens, and Sq at the end; empty for a dense call. Every rule above then
    applies per sequence, with its own lengths as the totals and its number as batch index."""
    cu_seqlens_kv: tuple[int, ...] = ()
    seq_q_start: tuple[int, ...] = ()
    """Packed context parallelism (:mod:`attnbench.parallel.layout`): each sequence's first query
    of this call as a position within that sequence (its ``q_start``); empty = all 0."""
    seq_kv_start: tuple[int, ...] = ()
    seqlens_q_total: tuple[int, ...] = ()
    """Packed CP: each whole sequence's length (its ``seqlen_q_total``, for causal alignment and
    ALiBi); empty = this call's lengths, from ``cu_seqlens_q``."""
    seqlens_kv_total: tuple[int, ...] = ()
    decode: bool = False
    """A decode call: forward only (no autograd state is kept), K/V are a cache."""
    page_size: int = 0
    """Decode: the cache a backend reads is paged (:mod:`attnbench.problem.paged`); 0 =
    contiguous."""
    fp8_format: str = ""
    """fp8 case: the format of q, k, v (a key of :data:`attnbench.problem.fp8.FORMATS`); their real
    values are the fp8 values times :attr:`descales`. Empty: not fp8."""
    descales: tuple[tuple[float, ...], ...] = ()
    """fp8: (descale_q, descale_k, descale_v), each (B, Hkv) flattened row-major -- query head
    h uses KV head h // (Hq / Hkv)'s -- or a single value per tensor (per-tensor scaling).
    Set from the quantized inputs (:func:`attnbench.problem.fp8.with_descales`)."""

    @classmethod
    def from_case(cls, case: "Case") -> "AttnSpec":
        left, right = case.window_bounds
        return cls(
            scale=1.0 / math.sqrt(case.head_dim),
            window_left=left,
            window_right=right,
            softcap=case.softcap,
            alibi_slopes=tuple(alibi_slopes(case.heads_q)) if case.bias == "alibi" else None,
            dropout_p=case.dropout,
            # Dropout draws depend on the case seed but not on anything a rerun changes.
            dropout_seed=(case.seed * 1_000_003 + 12345) & 0x7FFFFFFF,
            seqlen_q_total=case.seqlen_q,
            seqlen_kv_total=case.seqlen_kv,
            cu_seqlens_q=cu_seqlens(case.seqlens_q) if case.is_packed else (),
            cu_seqlens_kv=cu_seqlens(case.seqlens_kv) if case.is_packed else (),
            decode=case.decode,
            page_size=case.page_size,
        )

    def replace(self, **changes) -> "AttnSpec":
        return dataclasses.replace(self, **changes)

    @property
    def is_packed(self) -> bool:
        return bool(self.cu_seqlens_q)

    @property
    def is_masked(self) -> bool:
        return self.window_left >= 0 or self.window_right >= 0

    @property
    def is_causal(self) -> bool:
        return self.window_left < 0 and self.window_right == 0

    @property
    def diagonal_offset(self) -> int:
        """Key position of global query 0 (bottom-right alignment)."""
        return self.seqlen_kv_total - self.seqlen_q_total

    # -- blocks of the global problem, as torch tensors (used by reference, naive, sdpa) ------
    def visible(self, q_pos: "torch.Tensor", k_pos: "torch.Tensor") -> Optional["torch.Tensor"]:
        """Bool (len(q_pos), len(k_pos)): which keys each query sees; None when all are seen."""
        if not self.is_masked:
            return None
        rel = k_pos[None, :] - (q_pos[:, None] + self.diagonal_offset)
        ok = None
        if self.window_right >= 0:
            ok = rel <= self.window_right
        if self.window_left >= 0:
            left_ok = rel >= -self.window_left
            ok = left_ok if ok is None else ok & left_ok
        return ok

    def alibi_bias(self, heads: "torch.Tensor", q_pos: "torch.Tensor", k_pos: "torch.Tensor",
                   dtype) -> Optional["torch.Tensor"]:
        """(len(heads), len(q_pos), len(k_pos)) additive bias for global heads, or None."""
        if self.alibi_slopes is None:
            return None
        import torch

        slopes = torch.tensor(self.alibi_slopes, dtype=torch.float64, device=q_pos.device)[heads]
        dist = (q_pos[:, None] + self.diagonal_offset - k_pos[None, :]).abs().to(torch.float64)
        return (-slopes[:, None, None] * dist[None]).to(dtype)

    def score_block(self, qk: "torch.Tensor", heads: "torch.Tensor", q_pos: "torch.Tensor",
                    k_pos: "torch.Tensor"):
        """The convention from q @ k^T to the scores, before masking: scale, softcap, + ALiBi.
        ``qk`` (B, *head dims, Sq, Sk) -- head dims (Hq,) or (Hkv, G) -- for global ``heads``
        (Hq,) and positions; computed in qk's dtype. Returns (scores, tanh of the softcap or
        None: its derivative is 1 - tanh^2)."""
        import torch

        s = qk * self.scale
        tanh = None
        if self.softcap > 0:
            tanh = torch.tanh(s / self.softcap)
            s = self.softcap * tanh
        bias = self.alibi_bias(heads, q_pos, k_pos, qk.dtype)
        if bias is not None:
            s = s + bias.reshape(*qk.shape[1:-2], *bias.shape[1:])
        return s, tanh

    def positions(self, n_q: int, n_k: int, device=None):
        """Global positions of this call's queries and keys."""
        import torch

        return (torch.arange(self.q_start, self.q_start + n_q, device=device),
                torch.arange(self.kv_start, self.kv_start + n_k, device=device))
