"""The rules of decode cases (``decode: true``, ``page_size``), checked when a case is made.

A decode case is what inference runs once per generated token: 1..MAX_DECODE_Q new query tokens
attend to a KV cache that already holds them as its last positions (bottom-right alignment,
the convention of :mod:`attnbench.problem`), forward only, on one device, without dropout. The
cache may be paged: ``page_size`` tokens per page, pages found through a block table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attnbench.errors import SweepError
from attnbench.validation import fail

if TYPE_CHECKING:
    from attnbench.spec import Case

MAX_DECODE_Q = 16
"""Query tokens of a decode case: one new token, or a few (speculative decoding, multi-token
prediction: flash-attn's ``flash_attn_with_kvcache`` takes any seqlen_q; 16 covers them)."""
MAX_PAGE_SIZE = 1 << 16
"""Tokens in one cache page: vLLM pages hold 16, flash-attn's 256 (FA2: a multiple of 256)."""
_SINGLE_DEVICE = {"dropout": 0.0, "cp": 1, "tp": 1}


def check_decode(where: str, case: "Case") -> None:
    """The relations of decode fields: a decode case is a forward of 1..MAX_DECODE_Q queries
    at the end of a cache, on one device, without dropout; pages only in decode cases."""
    def bad(name: str, given: Any, expected: str) -> SweepError:
        return fail(f"{where}: {name}", given, expected)

    if case.page_size and not case.decode:
        raise bad("page_size", case.page_size, "0 unless decode: true (pages hold a KV cache)")
    if case.page_size > case.seqlen_kv:
        raise bad("page_size", case.page_size, f"at most seqlen_kv={case.seqlen_kv} (a page "
                  "larger than the whole cache)")
    if not case.decode:
        return
    if case.backward:
        raise bad("backward", True, "false for a decode case (decode is forward only)")
    if not 1 <= case.seqlen_q <= min(MAX_DECODE_Q, case.seqlen_kv):
        raise bad("seqlen_q", case.seqlen_q, f"1..{MAX_DECODE_Q} for a decode case, at most "
                  f"seqlen_kv={case.seqlen_kv} (the new tokens are the cache's last positions)")
    for name in ("dropout", "cp", "tp"):
        if getattr(case, name) != _SINGLE_DEVICE[name]:
            raise bad(name, getattr(case, name), f"{_SINGLE_DEVICE[name]} for a decode case "
                      "(inference on one device)")
