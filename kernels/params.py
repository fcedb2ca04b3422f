"""What a kernel launch needs besides the tensors, and the small helpers every launcher shares.

This module is plain Python (no ``@triton.jit``): the backend builds :class:`FlashParams` from an
:class:`attnbench.problem.attn_spec.AttnSpec`, the launchers turn it into kernel arguments.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch

from attnbench.kernels.common import LOG2E, UNBOUNDED


@dataclass(frozen=True, kw_only=True, slots=True)
class FlashParams:
    """Features of one call, in the conventions of :mod:`attnbench.problem.attn_spec`."""

    sm_scale: float
    diag: int = 0
    """Local key index of local query 0's aligned diagonal:
    q_start + (Sk_total - Sq_total) - kv_start."""
    window_left: int = -1
    """Keys before the diagonal a query sees; -1 = unbounded."""
    window_right: int = -1
    """Keys after the diagonal a query sees; -1 = unbounded (0 = causal)."""
    softcap: float = 0.0
    alibi_slopes: Optional[tuple[float, ...]] = None
    """Slopes of the *global* query heads; this call uses [head_start, head_start + Hq)."""
    dropout_p: float = 0.0
    dropout_seed: int = 0
    q_start: int = 0
    kv_start: int = 0
    head_start: int = 0
    batch_start: int = 0
    cu_seqlens_q: tuple[int, ...] = ()
    """Packed call (tensors (1, H, T, D)): offsets of each sequence's queries, N + 1 entries;
    empty for a dense call."""
    cu_seqlens_kv: tuple[int, ...] = ()
    seq_q_start: tuple[int, ...] = ()
    """Packed context parallelism: each sequence's first query of this call as a position in
    its sequence (empty: 0); likewise keys. See :class:`attnbench.problem.attn_spec.AttnSpec`."""
    seq_kv_start: tuple[int, ...] = ()
    seqlens_q_total: tuple[int, ...] = ()
    """Packed CP: each whole sequence's length (empty: this call's lengths)."""
    seqlens_kv_total: tuple[int, ...] = ()

    @property
    def varlen(self) -> bool:
        return bool(self.cu_seqlens_q)

    def grid_rows(self, batch: int, seqlen: int, heads: int, keys: bool = False
                  ) -> tuple[int, int]:
        """(length the grid's block axis must cover, programs along its (batch, head) axis)
        for tensors of ``batch`` x ``seqlen`` with ``heads``; packed: the longest sequence
        (of the keys when ``keys``) and one row per (sequence, head)."""
        if not self.varlen:
            return seqlen, batch * heads
        cu = self.cu_seqlens_kv if keys else self.cu_seqlens_q
        return max(b - a for a, b in zip(cu, cu[1:])), (len(cu) - 1) * heads

    def cu_tensors(self, device: torch.device) -> dict:
        """The kernels' ``cu_q_ptr`` / ``cu_k_ptr``: int32 offsets, and ``place_ptr``: per
        sequence (diag, q_start, kv_start) -- its own bottom-right diagonal in local indices
        and where its chunk sits in it (packed CP; (Sk - Sq, 0, 0) for a whole sequence);
        built once per pack and device (not inside a timed call); 1-element placeholders for a
        dense call."""
        return {"cu_q_ptr": _int32_tensor(self.cu_seqlens_q or (0,), str(device)),
                "cu_k_ptr": _int32_tensor(self.cu_seqlens_kv or (0,), str(device)),
                "place_ptr": _int32_tensor(self.placement() or (0,), str(device))}

    def placement(self) -> tuple[int, ...]:
        """(diag, q_start, kv_start) of each sequence of a packed call, flattened."""
        cu_q, cu_k = self.cu_seqlens_q, self.cu_seqlens_kv
        out: list[int] = []
        for b in range(len(cu_q) - 1):
            len_q, len_k = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
            total_q = self.seqlens_q_total[b] if self.seqlens_q_total else len_q
            total_k = self.seqlens_kv_total[b] if self.seqlens_kv_total else len_k
            q0 = self.seq_q_start[b] if self.seq_q_start else 0
            k0 = self.seq_kv_start[b] if self.seq_kv_start else 0
            out += [q0 + total_k - total_q - k0, q0, k0]
        return tuple(out)

    @property
    def has_window(self) -> bool:
        return self.window_left >= 0 or self.window_right >= 0

    @property
    def drop_threshold(self) -> int:
        return dropout_threshold(self.dropout_p)

    def slopes_log2(self, device: torch.device, heads_q: int) -> torch.Tensor:
        """(Hq,) float32 ALiBi slopes of this call's heads times LOG2E (scores are in log2
        units in the kernels); a 1-element placeholder when there is no ALiBi."""
        return _slopes_tensor(self.alibi_slopes, self.head_start, heads_q, str(device))

    def kernel_scalars(self) -> dict:
        return dict(
            diag=self.diag,
            sm_scale=self.sm_scale,
            softcap=self.softcap,
            window_left=self.window_left if self.window_left >= 0 else UNBOUNDED,
            window_right=self.window_right if self.window_right >= 0 else UNBOUNDED,
            seed=self.dropout_seed,
            drop_threshold=self.drop_threshold,
            drop_scale=1.0 / (1.0 - self.dropout_p),
            q_start=self.q_start,
            kv_start=self.kv_start,
            head_start=self.head_start,
            batch_start=self.batch_start,
        )

    def kernel_flags(self, dtype: torch.dtype, head_dim: int, head_dim_v: int, *,
                     interpreted: bool) -> dict:
        """Constexpr arguments: features switched on, padded head dims, numerics."""
        return dict(
            HEAD_DIM=head_dim,
            HEAD_DIM_V=head_dim_v,
            BLOCK_D=padded_head_dim(head_dim),
            BLOCK_DV=padded_head_dim(head_dim_v),
            WINDOW=self.has_window,
            SOFTCAP=self.softcap > 0,
            ALIBI=self.alibi_slopes is not None,
            DROPOUT=self.dropout_p > 0,
            VARLEN=self.varlen,
            # The interpreter does bf16/fp16 arithmetic on raw bits: give it fp32 tiles. On the
            # GPU, 16-bit operands stay 16-bit so tl.dot runs on tensor cores.
            UPCAST=interpreted,
            # fp32 inputs must not silently become tf32 on the GPU; 16-bit dots ignore this.
            DOT_PRECISION="ieee" if (dtype == torch.float32 or interpreted) else "tf32",
        )


def dropout_threshold(p: float) -> int:
    """An element is kept iff the top 31 bits of its Philox word are >= this, so
    P(keep) = 1 - p to within 2^-31 (integer compare: exactly reproducible anywhere)."""
    return min(round(p * 2**31), 2**31 - 1)


def padded_head_dim(d: int) -> int:
    """Tiles are powers of two and tl.dot needs every dimension >= 16."""
    return max(16, triton_next_power_of_2(d))


def triton_next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


@functools.lru_cache(maxsize=64)
def _slopes_tensor(slopes: Optional[tuple[float, ...]], head_start: int, heads_q: int,
                   device: str) -> torch.Tensor:
    if slopes is None:
        return torch.zeros(1, dtype=torch.float32, device=device)
    local = [s * LOG2E.value for s in slopes[head_start:head_start + heads_q]]
    if len(local) != heads_q:
        raise ValueError(f"{len(slopes)} ALiBi slopes cannot cover heads "
                         f"[{head_start}, {head_start + heads_q})")
    return torch.tensor(local, dtype=torch.float32, device=device)


@functools.lru_cache(maxsize=16)
def _int32_tensor(values: tuple[int, ...], device: str) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


def is_interpreted(kernel) -> bool:
    """Whether ``kernel`` (a @triton.jit function) was created under TRITON_INTERPRET=1."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(kernel, InterpretedFunction)


def strides(prefix: str, t: torch.Tensor, seq_name: str) -> dict[str, int]:
    """Keyword strides of a (B, H, S, D) tensor as the kernels name them:
    stride_{prefix}b, _h, _{seq_name}, _d."""
    return {f"stride_{prefix}{d}": s for d, s in zip(("b", "h", seq_name, "d"), t.stride())}
