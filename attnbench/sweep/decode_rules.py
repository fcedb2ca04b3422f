"""The rules of decode cases (``decode: true``, ``page_size``), checked when a case is made.

A decode case is what inference runs once per generated token: 1..MAX_DECODE_Q new query tokens
attend to a KV cache that already holds them as its last positions (bottom-right alignment,
the convention of :mod:`attnbench.problem.attn_spec`), forward only, on one device, without dropout.
The cache may be paged: ``page_size`` tokens per page, pages found through a block table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attnbench.errors import SweepError
from attnbench.validation import fail

if TYPE_CHECKING:
    from attnbench.sweep.case import Case

MAX_DECODE_Q = 16
"""Query tokens of a decode case: one new token, or a few (speculative decoding, multi-token
prediction: flash-attn's ``flash_attn_with_kvcache`` takes any seqlen_q; 16 covers them)."""
MAX_PAGE_SIZE = 1 << 16
"""Tokens in one cache page: vLLM pages hold 16, flash-attn's 256 (FA2: a multiple of 256)."""
_SINGLE_DEVICE = {"dropout": 0.0, "cp": 1, "tp": 1}


def check_capacity(where: str, v: dict[str, Any]) -> None:
    """A decode case's ``seqlens_kv`` (one cache length per sequence) beside ``seqlen_kv``: then
    seqlen_kv is the cache's capacity, and no sequence may hold more. Checked before the
    lengths are packed (:func:`attnbench.sweep.packed_rules.resolve_packing`), which makes seqlen_kv
    their sum, as in every packed case."""
    if not (v.get("decode") and v.get("seqlens_kv") and v.get("seqlen_kv")):
        return
    capacity = v.pop("seqlen_kv")
    for i, length in enumerate(v["seqlens_kv"]):
        if length > capacity:
            raise fail(f"{where}: seqlens_kv[{i}]", length, f"at most seqlen_kv={capacity} (the "
                       "cache's capacity, in a decode case that gives both)")


def check_decode(where: str, case: "Case") -> None:
    """The relations of decode fields: a decode case is a forward of 1..MAX_DECODE_Q queries
    at the end of each sequence's cache, on one device, without dropout; pages only in
    decode cases."""
    def bad(name: str, given: Any, expected: str) -> SweepError:
        return fail(f"{where}: {name}", given, expected)

    lengths = (list(zip(case.seqlens_q, case.seqlens_kv)) if case.is_packed
               else [(case.seqlen_q, case.seqlen_kv)])
    longest = max(k for _, k in lengths)
    if case.page_size and not case.decode:
        raise bad("page_size", case.page_size, "0 unless decode: true (pages hold a KV cache)")
    if case.page_size > longest:
        raise bad("page_size", case.page_size, f"at most {longest} (the longest cache: a page "
                  "larger than the whole cache)")
    if not case.decode:
        return
    if case.backward:
        raise bad("backward", True, "false for a decode case (decode is forward only)")
    if len({q for q, _ in lengths}) > 1:
        raise bad("seqlens_q", list(case.seqlens_q), "the same seqlen_q new tokens in every "
                  "sequence of a decode case (give seqlens_kv and seqlen_q, not seqlens_q)")
    for i, (new, cached) in enumerate(lengths):
        if not 1 <= new <= min(MAX_DECODE_Q, cached):
            name = "seqlen_q" if len(lengths) == 1 else f"seqlen_q (sequence {i})"
            raise bad(name, new, f"1..{MAX_DECODE_Q} for a decode case, at most its cache "
                      f"length {cached} (the new tokens are the cache's last positions)")
    for name in ("dropout", "cp", "tp"):
        if getattr(case, name) != _SINGLE_DEVICE[name]:
            raise bad(name, getattr(case, name), f"{_SINGLE_DEVICE[name]} for a decode case "
                      "(inference on one device)")
