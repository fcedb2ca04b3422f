"""Which part of the global problem each rank holds: sequence segments (CP) and heads (TP).

Legend: B = batch, Hq / Hkv = query / key-value heads, S = sequence, D = head dim; tensors are
(B, H, S, D). A rank's local tensor is the concatenation, along S, of its segments in order.

Sequence layouts (``cp`` ranks, ``n`` positions):

* ``ring`` and ``allgather``: rank c holds chunk c of ``cp`` equal chunks.
* ``zigzag``: the sequence is cut into ``2 cp`` chunks and rank c holds chunks c and
  ``2 cp - 1 - c``: under a causal mask every rank then has the same amount of visible work
  (rank 0 has the cheapest and the dearest chunk), where plain ``ring`` leaves rank 0 idle
  while rank cp-1 attends to everything.

Packed cases (``seqlens_q``): the same layouts, per sequence. Every sequence is cut into
``cp`` (``2 cp`` for zigzag) chunks and rank c holds chunk c (c and ``2 cp - 1 - c``) of *every*
sequence, as ring-flash-attn's varlen functions do, so causal work stays balanced whatever the
mix of lengths. Chunks are padding-free and may be uneven: a sequence of n tokens in p chunks
gives the first ``n % p`` chunks one token more (a sequence shorter than p tokens leaves some
chunks empty), so any lengths split. A rank's slot i (:class:`PackedSegment`) is chunk i of
every sequence, laid out as a pack of its own; a block of the ring is one packed backend call
whose spec places each sequence's chunk in its sequence (:func:`block_spec`). Ranks then hold
different numbers of tokens: what travels is padded to the longest (:func:`padded`).

Heads (``tp`` ranks): query heads are split in equal contiguous slices; K/V heads follow their
GQA groups (group = Hq / Hkv is contiguous, see :mod:`attnbench.problem.attn_spec`), so a rank's
query heads only ever read its own K/V heads. MQA's single K/V head is replicated on every TP rank
and its gradient summed over them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from attnbench.problem.attn_spec import AttnSpec
from attnbench.problem.packing import cu_seqlens
from attnbench.sweep.case import Case


@dataclass(frozen=True)
class Segment:
    """Global positions [start, start + length)."""

    start: int
    length: int

    @property
    def stop(self) -> int:
        return self.start + self.length

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        """Rows of the global tensor, in local order."""
        return ((self.start, self.stop),)


@dataclass(frozen=True)
class PackedSegment:
    """Slot of a packed shard: one chunk of every sequence -- sequence b's positions
    [starts[b], starts[b] + lengths[b]) of its ``totals[b]`` -- laid out as a pack."""

    starts: tuple[int, ...]
    lengths: tuple[int, ...]
    totals: tuple[int, ...]

    @property
    def length(self) -> int:
        return sum(self.lengths)

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        """Rows of the global pack buffer, in local order (sequence b starts at cu[b])."""
        cu = cu_seqlens(self.totals)
        return tuple((cu[b] + a, cu[b] + a + n) for b, (a, n) in
                     enumerate(zip(self.starts, self.lengths)))


def chunk(n: int, parts: int, index: int) -> Segment:
    """Chunk ``index`` of ``parts`` padding-free chunks of n positions: the first n % parts
    chunks have one position more."""
    base, extra = divmod(n, parts)
    return Segment(index * base + min(index, extra), base + (index < extra))


def chunk_indices(algo: str, cp: int, cp_rank: int) -> tuple[tuple[int, ...], int]:
    """(which chunks rank ``cp_rank`` holds, how many chunks a sequence is cut into)."""
    if cp == 1:
        return (0,), 1
    if algo == "zigzag":
        return (cp_rank, 2 * cp - 1 - cp_rank), 2 * cp
    return (cp_rank,), cp


def packed_segments(algo: str, lengths: Sequence[int], cp: int,
                    cp_rank: int) -> tuple[PackedSegment, ...]:
    indices, parts = chunk_indices(algo, cp, cp_rank)
    slots = []
    for i in indices:
        pieces = [chunk(n, parts, i) for n in lengths]
        slots.append(PackedSegment(tuple(p.start for p in pieces),
                                   tuple(p.length for p in pieces), tuple(lengths)))
    return tuple(slots)


def block_spec(spec: AttnSpec, q_seg, kv_seg) -> AttnSpec:
    """The spec of one backend call on query segment ``q_seg`` and key segment ``kv_seg``:
    their global offsets (dense), or each sequence's chunk placed in its sequence (packed)."""
    if isinstance(q_seg, Segment):
        return spec.replace(q_start=q_seg.start, kv_start=kv_seg.start)
    return spec.replace(cu_seqlens_q=cu_seqlens(q_seg.lengths),
                        cu_seqlens_kv=cu_seqlens(kv_seg.lengths), seq_q_start=q_seg.starts,
                        seq_kv_start=kv_seg.starts, seqlens_q_total=q_seg.totals,
                        seqlens_kv_total=kv_seg.totals)


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


def any_visible(spec: AttnSpec, q_seg, k_seg) -> bool:
    """Does any query of ``q_seg`` see any key of ``k_seg``? Exact: j - (i + offset) takes every
    integer value between its extremes over the two contiguous ranges. Packed: in any sequence
    (of the spec of the whole pack)."""
    if isinstance(q_seg, PackedSegment):
        return any(nq and nk and any_visible(spec.replace(seqlen_q_total=tq, seqlen_kv_total=tk),
                                             Segment(aq, nq), Segment(ak, nk))
                   for aq, nq, tq, ak, nk, tk in zip(q_seg.starts, q_seg.lengths, q_seg.totals,
                                                    k_seg.starts, k_seg.lengths, k_seg.totals))
    if not q_seg.length or not k_seg.length:
        return False
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
    if case.cp > 1 and not case.is_packed:  # packed: uneven chunks, any lengths split
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
    q_segments: tuple  # of Segment, or of PackedSegment (packed CP)
    kv_segments: tuple
    heads: HeadShard

    @classmethod
    def of(cls, case: Case, cp_rank: int, tp_rank: int) -> "Shard":
        return cls(case=case, cp_rank=cp_rank, tp_rank=tp_rank,
                   q_segments=_segments(case, case.seqlen_q, case.seqlens_q, cp_rank),
                   kv_segments=_segments(case, case.seqlen_kv, case.seqlens_kv, cp_rank),
                   heads=head_shard(case, tp_rank))

    def kv_segments_of(self, cp_rank: int) -> tuple:
        """The K/V segments CP rank ``cp_rank`` owns (what arrives at a ring step)."""
        case = self.case
        return _segments(case, case.seqlen_kv, case.seqlens_kv, cp_rank)

    def whole_kv(self):
        """All keys as one segment (all-gather CP)."""
        if isinstance(self.kv_segments[0], PackedSegment):
            totals = self.kv_segments[0].totals
            return PackedSegment((0,) * len(totals), totals, totals)
        return Segment(0, self.case.seqlen_kv)

    def local_length(self, side: str) -> int:
        """Positions this rank holds on ``side`` ("q" or "kv")."""
        return sum(s.length for s in (self.q_segments if side == "q" else self.kv_segments))

    def capacity(self, side: str) -> int:
        """The most positions any CP rank holds on ``side`` ("q" or "kv"): what a message of
        local tensors is padded to (packed chunks are uneven; dense ones never are)."""
        case = self.case
        n, lengths = (case.seqlen_q, case.seqlens_q) if side == "q" else \
            (case.seqlen_kv, case.seqlens_kv)
        return max(sum(s.length for s in _segments(case, n, lengths, r)) for r in range(case.cp))

    def slice_q(self, x: torch.Tensor) -> torch.Tensor:
        """Local part of a query-side tensor (q, dout, out: (B, Hq, Sq, *))."""
        h = self.heads
        return take_rows(x[:, h.q_start:h.q_start + h.q_count], self.q_segments)

    def slice_kv(self, x: torch.Tensor) -> torch.Tensor:
        """Local part of a key-side tensor (k, v: (B, Hkv, Sk, *))."""
        h = self.heads
        return take_rows(x[:, h.kv_start:h.kv_start + h.kv_count], self.kv_segments)

    def place_q(self, full: torch.Tensor, local: torch.Tensor) -> None:
        h = self.heads
        put_rows(full[:, h.q_start:h.q_start + h.q_count], local, self.q_segments)

    def place_kv(self, full: torch.Tensor, local: torch.Tensor) -> None:
        h = self.heads
        put_rows(full[:, h.kv_start:h.kv_start + h.kv_count], local, self.kv_segments)


def _segments(case: Case, n: int, lengths: Sequence[int], cp_rank: int) -> tuple:
    if case.is_packed and case.cp > 1:
        return packed_segments(case.cp_algo, lengths, case.cp, cp_rank)
    return sequence_segments(case.cp_algo, n, case.cp, cp_rank)


def take_rows(x: torch.Tensor, segments: Sequence) -> torch.Tensor:
    return torch.cat([x[:, :, a:b] for s in segments for a, b in s.ranges], dim=2).contiguous()


def put_rows(full: torch.Tensor, local: torch.Tensor, segments: Sequence) -> None:
    at = 0
    for seg in segments:
        for a, b in seg.ranges:
            full[:, :, a:b] = local[:, :, at:at + b - a]
            at += b - a


def padded(x: torch.Tensor, length: int) -> torch.Tensor:
    """``x`` (B, H, S, *) with zero rows appended up to S = ``length`` (uneven packed chunks:
    every rank's message must have the same shape)."""
    if x.shape[2] == length:
        return x
    pad = x.new_zeros(*x.shape[:2], length - x.shape[2], *x.shape[3:])
    return torch.cat([x, pad], dim=2)
