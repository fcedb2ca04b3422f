"""Layout of packed (variable-length) cases: sequences one after another in one buffer.

Legend: N = sequences, Tq / Tk = total query / key tokens (a packed case's ``seqlen_q`` /
``seqlen_kv``), H = heads, D = head dim. A packed case's tensors are (1, H, T, D): sequence b's
queries are rows ``cu_q[b]:cu_q[b+1]`` and its keys ``cu_k[b]:cu_k[b+1]``, where ``cu_*`` are
the cumulative lengths (flash-attn's ``cu_seqlens``, starting at 0, N + 1 entries).
flash-attn's varlen functions take (T, H, D): :func:`to_thd` / :func:`from_thd`.

The semantics are per sequence (no query sees a key of another sequence): masks, causal
alignment (bottom-right within the sequence), ALiBi distances and dropout positions are those of
sequence b alone, as a dense case of one sequence with batch index b would have them. So the
attention of a packed case is exactly, bit for bit in its definition, the dense attention of
each sequence: :func:`sequence_spec` gives that dense call's spec, and the fp64 reference, the
fused-precision baseline and the naive backend compute packed cases through it.

Pure Python except for the helpers that take tensors (torch is imported by their callers).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Iterator, Sequence

if TYPE_CHECKING:
    import torch

    from attnbench.problem.attn_spec import AttnSpec


def cu_seqlens(lengths: Sequence[int]) -> tuple[int, ...]:
    """(0, l0, l0 + l1, ..., sum): where each sequence starts, and the total at the end."""
    return (0, *accumulate(lengths))


@dataclass(frozen=True, slots=True)
class Segment:
    """Sequence ``index`` of a pack: its queries are rows [q0, q1), its keys [k0, k1)."""

    index: int
    q0: int
    q1: int
    k0: int
    k1: int

    @property
    def len_q(self) -> int:
        return self.q1 - self.q0

    @property
    def len_k(self) -> int:
        return self.k1 - self.k0


def segments(cu_q: Sequence[int], cu_k: Sequence[int]) -> list[Segment]:
    """One :class:`Segment` per sequence of a pack."""
    if len(cu_q) != len(cu_k) or len(cu_q) < 2:
        raise ValueError(f"cu_seqlens of {len(cu_q)} and {len(cu_k)} entries: expected the "
                         "same number, at least 2")
    return [Segment(b, cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1])
            for b in range(len(cu_q) - 1)]


def sequence_spec(spec: "AttnSpec", seg: Segment) -> "AttnSpec":
    """The dense spec of sequence ``seg`` alone: its lengths are the totals (so causal and ALiBi
    align within it), it starts at position 0, and its batch index is its sequence number (so
    dropout draws what a dense batch element ``seg.index`` would). A call of packed context
    parallelism holds a chunk of each sequence: its ``seq_*_start`` and ``seqlens_*_total``
    place the chunk in its sequence, as ``q_start`` / ``seqlen_q_total`` do for a dense chunk."""
    b = seg.index
    return spec.replace(
        seqlen_q_total=spec.seqlens_q_total[b] if spec.seqlens_q_total else seg.len_q,
        seqlen_kv_total=spec.seqlens_kv_total[b] if spec.seqlens_kv_total else seg.len_k,
        q_start=spec.seq_q_start[b] if spec.seq_q_start else 0,
        kv_start=spec.seq_kv_start[b] if spec.seq_kv_start else 0,
        batch_start=spec.batch_start + b, cu_seqlens_q=(), cu_seqlens_kv=(), seq_q_start=(),
        seq_kv_start=(), seqlens_q_total=(), seqlens_kv_total=())


def per_sequence(spec: "AttnSpec") -> Iterator[tuple[Segment, "AttnSpec"]]:
    """(segment, its dense spec) for every sequence of a packed spec."""
    for seg in segments(spec.cu_seqlens_q, spec.cu_seqlens_kv):
        yield seg, sequence_spec(spec, seg)


def cu_tensor(cu: Sequence[int], device) -> "torch.Tensor":
    """``cu_seqlens`` as the int32 tensor flash-attn and our kernels take."""
    import torch

    return torch.tensor(list(cu), dtype=torch.int32, device=device)


def to_thd(x: "torch.Tensor") -> "torch.Tensor":
    """(1, H, T, D) -> (T, H, D), flash-attn's varlen layout (a copy, contiguous)."""
    return x[0].transpose(0, 1).contiguous()


def from_thd(x: "torch.Tensor") -> "torch.Tensor":
    """(T, H, D) -> (1, H, T, D)."""
    return x.transpose(0, 1).unsqueeze(0)


def forward_per_sequence(dense_forward, q, k, v, spec: "AttnSpec", *args, **kwargs):
    """A dense forward ``(q, k, v, spec, ...) -> (out, lse)`` run on each sequence of a packed
    call (tensors (1, H, T, *)) with :func:`sequence_spec`; the results packed again."""
    import torch

    outs, lses = [], []
    for seg, sub in per_sequence(spec):
        out, lse = dense_forward(q[:, :, seg.q0:seg.q1], k[:, :, seg.k0:seg.k1],
                                 v[:, :, seg.k0:seg.k1], sub, *args, **kwargs)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs, 2), torch.cat(lses, 2)


def backward_per_sequence(dense_backward, q, k, v, out, lse, dout, spec: "AttnSpec", *args,
                          **kwargs):
    """A dense backward ``(q, k, v, out, lse, dout, spec, ...) -> (dq, dk, dv)`` run on each
    sequence of a packed call; the gradients packed again."""
    import torch

    grads: list[list] = [[], [], []]
    for seg, sub in per_sequence(spec):
        rows, keys = slice(seg.q0, seg.q1), slice(seg.k0, seg.k1)
        parts = dense_backward(q[:, :, rows], k[:, :, keys], v[:, :, keys], out[:, :, rows],
                               lse[:, :, rows], dout[:, :, rows], sub, *args, **kwargs)
        for acc, part in zip(grads, parts):
            acc.append(part)
    return tuple(torch.cat(parts, 2) for parts in grads)
