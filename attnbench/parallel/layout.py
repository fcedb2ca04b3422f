"""Which part of the global problem each rank holds: sequence segments (CP) and heads (TP).

Legend: B = batch, Hq / Hkv = query / key-value heads, S = sequence, D = head dim; tensors are
(B, H, S, D). A rank's local tensor is the concatenation, along S, of its segments in order.

Sequence layouts (``cp`` ranks, ``n`` positions):

* ``ring`` and ``allgather``: rank c holds chunk c of ``cp`` equal chunks.
* ``zigzag``: the sequence is cut into ``2 cp`` chunks and rank c holds chunks c and
  ``2 cp - 1 - c``: under a causal mask every rank then has the same amount of visible work
  (rank 0 has the cheapest and the dearest chunk), where plain ``ring`` leaves rank 0 idle
  while rank cp-1 attends to everything.

Heads (``tp`` ranks): query heads are split in equal contiguous slices; K/V heads follow their
GQA groups (group = Hq / Hkv is contiguous, see :mod:`attnbench.problem`), so a rank's query heads
only ever read its own K/V heads. MQA's single K/V head is replicated on every TP rank and its
gradient summed over them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from attnbench.problem import AttnSpec
from attnbench.spec import Case


@dataclass(frozen=True)
class Segment:
    """Global positions [start, start + length)."""

    start: int
    length: int

    @property
    def stop(self) -> int:
        return self.start + self.length


def sequence_segments(algo: str, n: int, cp: int, cp_rank: int) -> tuple[Segment, ...]:
    if cp == 1:
        return (Segment(0, n),)
    if algo == "zigzag":
        chunk = n // (2 * cp)
        return (Segment(cp_rank * chunk, chunk), Segment((2 * cp - 1 - cp_rank) * chunk, chunk))
    chunk = n // cp
    return (Segment(cp_rank * chunk, chunk),)


def offsets(segments: Sequence[Segment]) -> list[int]:
    """Where each segment starts in the local (concatenated) tensor."""
    out, at = [], 0
    for seg in segments:
        out.append(at)
        at += seg.length
    return out


def any_visible(spec: AttnSpec, q_seg: Segment, k_seg: Segment) -> bool:
    """Does any query of ``q_seg`` see any key of ``k_seg``? Exact: j - (i + offset) takes every
    integer value between its extremes over the two contiguous ranges."""
    if not spec.is_masked:
        return True
    lowest = k_seg.start - (q_seg.stop - 1) - spec.diagonal_offset
    highest = (k_seg.stop - 1) - q_seg.start - spec.diagonal_offset
    if spec.window_right >= 0 and lowest > spec.window_right:
        return False
    if spec.window_left >= 0 and highest < -spec.window_left:
        return False
    return True


@dataclass(frozen=True)
class HeadShard:
    q_start: int
    q_count: int
    kv_start: int
    kv_count: int
    kv_replicated: bool
    """MQA under TP: every TP rank holds the single K/V head; dK/dV are summed over TP."""


def head_shard(case: Case, tp_rank: int) -> HeadShard:
    q_count = case.heads_q // case.tp
    if case.heads_kv == 1:
        return HeadShard(tp_rank * q_count, q_count, 0, 1, kv_replicated=case.tp > 1)
    kv_count = case.heads_kv // case.tp
    return HeadShard(tp_rank * q_count, q_count, tp_rank * kv_count, kv_count, False)


def unsupported_reason(case: Case) -> Optional[str]:
    """Why this CP x TP split of ``case`` cannot run, or None. Checked identically on every rank
    before any communication."""
    if case.heads_q % case.tp:
        return (f"tp={case.tp}: heads_q={case.heads_q} cannot be split evenly across "
                f"{case.tp} ranks")
    if case.heads_kv > 1 and case.heads_kv % case.tp:
        return (f"tp={case.tp}: heads_kv={case.heads_kv} cannot be split evenly across "
                f"{case.tp} ranks (GQA groups are kept whole; only MQA's single K/V head is "
                "replicated)")
    if case.cp > 1:
        parts = 2 * case.cp if case.cp_algo == "zigzag" else case.cp
        for name, n in (("seqlen_q", case.seqlen_q), ("seqlen_kv", case.seqlen_kv)):
            if n % parts:
                return (f"cp={case.cp} {case.cp_algo}: {name}={n} is not a multiple of {parts}"
                        + (" (2 x cp chunks)" if case.cp_algo == "zigzag" else ""))
    return None


@dataclass(frozen=True)
class Shard:
    """Everything one rank holds of the global problem."""

    case: Case
    cp_rank: int
    tp_rank: int
    q_segments: tuple[Segment, ...]
    kv_segments: tuple[Segment, ...]
    heads: HeadShard

    @classmethod
    def of(cls, case: Case, cp_rank: int, tp_rank: int) -> "Shard":
        algo = case.cp_algo
        return cls(case=case, cp_rank=cp_rank, tp_rank=tp_rank,
                   q_segments=sequence_segments(algo, case.seqlen_q, case.cp, cp_rank),
                   kv_segments=sequence_segments(algo, case.seqlen_kv, case.cp, cp_rank),
                   heads=head_shard(case, tp_rank))

    def kv_segments_of(self, cp_rank: int) -> tuple[Segment, ...]:
        """The K/V segments CP rank ``cp_rank`` owns (what arrives at a ring step)."""
        return sequence_segments(self.case.cp_algo, self.case.seqlen_kv, self.case.cp, cp_rank)

    def slice_q(self, x: torch.Tensor) -> torch.Tensor:
        """Local part of a query-side tensor (q, dout, out: (B, Hq, Sq, *))."""
        h = self.heads
        return _take(x[:, h.q_start:h.q_start + h.q_count], self.q_segments)

    def slice_kv(self, x: torch.Tensor) -> torch.Tensor:
        """Local part of a key-side tensor (k, v: (B, Hkv, Sk, *))."""
        h = self.heads
        return _take(x[:, h.kv_start:h.kv_start + h.kv_count], self.kv_segments)

    def place_q(self, full: torch.Tensor, local: torch.Tensor) -> None:
        h = self.heads
        _put(full[:, h.q_start:h.q_start + h.q_count], local, self.q_segments)

    def place_kv(self, full: torch.Tensor, local: torch.Tensor) -> None:
        h = self.heads
        _put(full[:, h.kv_start:h.kv_start + h.kv_count], local, self.kv_segments)


def _take(x: torch.Tensor, segments: Sequence[Segment]) -> torch.Tensor:
    return torch.cat([x[:, :, s.start:s.stop] for s in segments], dim=2).contiguous()


def _put(full: torch.Tensor, local: torch.Tensor, segments: Sequence[Segment]) -> None:
    for seg, at in zip(segments, offsets(segments)):
        full[:, :, seg.start:seg.stop] = local[:, :, at:at + seg.length]
