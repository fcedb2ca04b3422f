"""Dense masks of one call, and the per-backend cache that keeps them out of timed calls.

A dense backend (naive, sdpa, xformers) turns the case's mask, ALiBi bias and -- for naive --
dropout keep-mask into S x S tensors. Building them is not the kernel's work: at 16k causal they
are gigabytes. :class:`Prepared` builds them once per (spec, shapes) and hands the same tensors
to every later call, so the timed calls (which follow the accuracy run or the warm-up) only run
the kernel; the case runner empties it when the case ends (:func:`release_prepared`), so no
case's masks outlive it.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Hashable

import torch

from attnbench.problem.dropout import hash_keep_mask


def dense_masks(spec, batch: int, heads_q: int, sq: int, sk: int, dtype, device,
                keep: bool = True):
    """(bias (Hq, Sq, Sk) or None, visible (Sq, Sk) or None, keep (B, Hq, Sq, Sk) or None) for
    one call, from global positions. ``keep=False``: no dropout mask (a backend that draws its
    own, hidden, never needs ours)."""
    q_pos, k_pos = spec.positions(sq, sk, device)
    heads = torch.arange(spec.head_start, spec.head_start + heads_q, device=device)
    bias = spec.alibi_bias(heads, q_pos, k_pos, dtype)
    visible = spec.visible(q_pos, k_pos)
    keep_mask = None
    if keep and spec.dropout_p > 0:
        batches = torch.arange(spec.batch_start, spec.batch_start + batch, device=device)
        keep_mask = hash_keep_mask(spec, batches, heads, q_pos, k_pos)
    return bias, visible, keep_mask


class Prepared:
    """What a backend derives from the case, built once per key and reused (at most ``size``
    keys kept: the forward's and one more, e.g. a CP step's)."""

    def __init__(self, size: int = 2):
        self.size = size
        self._entries: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        if key in self._entries:
            self._entries.move_to_end(key)
            return self._entries[key]
        value = build()
        self._entries[key] = value
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return value

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


class PreparesOnce:
    """Mixin: a backend's own :class:`Prepared` (per instance; backends are registry
    singletons, one per rank process)."""

    @property
    def prepared(self) -> Prepared:
        if "_prepared" not in self.__dict__:
            self.__dict__["_prepared"] = Prepared()
        return self.__dict__["_prepared"]


def call_key(spec, q: torch.Tensor, k: torch.Tensor, *extra: Hashable) -> tuple:
    """Everything a call's masks depend on: the spec and the shapes, dtype and device."""
    return (spec, tuple(q.shape), tuple(k.shape), q.dtype, str(q.device), *extra)


def release_prepared(backend: Any) -> None:
    """Drop what ``backend`` prepared for the case that just ended (if it keeps a
    :class:`Prepared` as ``prepared``)."""
    cache = getattr(backend, "prepared", None)
    if isinstance(cache, Prepared):
        cache.clear()
