"""A call's mask as flash-attn, FA3 and TransformerEngine take it: a window around the
bottom-right corner of that call.

Legend: Sq / Sk = this call's query / key lengths.

Those libraries place query i of a call at key ``i + Sk - Sq`` and let it see the keys
``window_size = (left, right)`` around that one (-1: unbounded; causal is (-1, 0)); their ALiBi
distances are measured from the same diagonal. attnbench places query i at key ``i + diag``,
``diag = q_start + diagonal_offset - kv_start`` (:mod:`attnbench.problem.attn_spec`). The two
agree when ``diag == Sk - Sq``, as on one device. Under all-gather CP
(:mod:`attnbench.parallel.allgather`) a rank's queries are a chunk of the sequence and its keys
all of it: ``diag`` is the chunk's start, not ``Sk - Sq``, and the case's window passed as it is
moved every mask and ALiBi bias of that call -- silently: the output is attention, of another
problem. sdpa (:func:`attnbench.backends.sdpa.attention_mask`) and xformers compute the call's
diagonal; :func:`local_window` does it for these libraries:

1. keys that no query of the call sees are cut off (a causal chunk sees keys up to its own end,
   a window none left of its first query's left edge): the call passes a slice of its keys;
2. the window is shifted by how far the call's diagonal sits from the bottom-right corner of
   that slice: ``shift = diag' - (Sk' - Sq)``, ``left' = left - shift``, ``right' = right +
   shift``;
3. what such a window cannot say is refused (:class:`attnbench.backends.base.Unsupported`): a
   bound that would have to be negative (-1 means unbounded to the library), or ALiBi away from
   the corner (its distances are the library's own).

A causal chunk always becomes plain causal (cut at its end: shift 0), with or without ALiBi;
non-causal ALiBi on any chunk but the last is refused.

Torch-free: positions only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from attnbench.backends.base import Unsupported

if TYPE_CHECKING:
    from attnbench.problem.attn_spec import AttnSpec


@dataclass(frozen=True, slots=True)
class CallWindow:
    """What a bottom-right library is given for one call."""

    left: int
    right: int
    """``window_size``: keys seen left and right of the call's bottom-right diagonal (-1:
    unbounded)."""
    keys: Optional[tuple[int, int]] = None
    """``(first, end)``: the call passes keys[first:end] only (those no query sees are cut
    off); None: all of them, as given."""

    @property
    def causal(self) -> bool:
        """Plain causal: pass ``causal=True`` and no window (flash-attn's Sq = 1 GQA fast path
        and TE's causal masks read that flag, not a (-1, 0) window)."""
        return self.left < 0 and self.right == 0

    @property
    def windowed(self) -> bool:
        """A sliding window: pass ``window_size=(left, right)``."""
        return not self.causal and (self.left >= 0 or self.right >= 0)


def as_given(spec: "AttnSpec") -> CallWindow:
    """The spec's own window, for calls whose alignment the library computes itself (packed
    sequences, a decode cache: both bottom-right per sequence)."""
    return CallWindow(spec.window_left, spec.window_right)


def local_window(spec: "AttnSpec", sq: int, sk: int, *, alibi: bool = False,
                 library: str) -> CallWindow:
    """This dense call's mask as a window around its bottom-right corner, with the keys to cut
    off; raises :class:`Unsupported` (naming ``library``) when no window can say it."""
    diag = spec.q_start + spec.diagonal_offset - spec.kv_start
    left, right = spec.window_left, spec.window_right
    if diag == sk - sq:
        return CallWindow(left, right)  # the library's own corner: nothing to move
    first = max(0, diag - left) if left >= 0 else 0  # query 0's left edge
    end = min(sk, diag + sq + right) if right >= 0 else sk  # one past the last query's right
    where = (f"this call's queries sit at key {diag} of its {sk}, not at its bottom-right "
             f"corner {sk - sq} (a chunk of the sequence: all-gather CP)")
    if end <= first:
        raise Unsupported(f"{library}: no query of this call sees a key ({where})")
    shift = (diag - first) - ((end - first) - sq)
    new_left = left - shift if left >= 0 else -1
    new_right = right + shift if right >= 0 else -1
    if (left >= 0 > new_left) or (right >= 0 > new_right):
        raise Unsupported(f"{library} aligns each call's window bottom-right and -1 means "
                          f"unbounded: window ({left}, {right}) would need ({new_left}, "
                          f"{new_right}) here; {where}")
    if alibi and shift:
        raise Unsupported(f"{library} measures ALiBi distances from each call's bottom-right "
                          f"corner: {where}, {shift} keys away; only causal calls can be cut "
                          "to their corner")
    return CallWindow(new_left, new_right, None if (first, end) == (0, sk) else (first, end))
