"""What a run keeps in memory of each recorded case: its verdict and attempt, never the record.

The driver of a sweep of 10^6 cases must not grow with its journal (issue 29): a record held in
memory cost ~7.5 KB (a simulated record parsed back from its 1.2 KB line:
benchmarks/scale_memory.py), an :class:`Entry` ~0.1 KB with its dict slot. What scheduling asks
of a recorded case is whether to run it again (its verdict), its next attempt number, and
whether a result that arrives is a second one (a new :class:`Entry` per record written: the
run loop compares them by identity). Everything else is read back from the journal, streamed
(:func:`~attnbench.results.journal.journal_records`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

from attnbench.results.journal import journal_records


class Entry:
    """One case's last record, as the run remembers it."""

    __slots__ = ("verdict", "attempt")

    def __init__(self, verdict: str, attempt: int):
        self.verdict = sys.intern(verdict)  # a handful of verdicts: one string each, shared
        self.attempt = attempt

    @classmethod
    def of(cls, record: dict) -> "Entry":
        return cls(record["verdict"], int(record.get("attempt") or 1))

    def __repr__(self) -> str:
        return f"Entry({self.verdict!r}, {self.attempt})"


def read_ledger(path: Path) -> dict[str, Entry]:
    """Case id -> :class:`Entry` of its last record in the journal at ``path`` (absent: none),
    streamed: memory is the ledger, not the journal."""
    if not path.exists():
        return {}
    return {record["id"]: Entry.of(record) for _, record in journal_records(path)}


def last_records(path: Path) -> Iterator[dict]:
    """Each case's last record in the journal at ``path``, streamed in two passes: the first
    notes the line of each id's last record (~100 B a case), the second yields those records,
    in the order of their lines (:func:`~attnbench.results.store.load_records` keeps a case
    where it first appeared). The same records as ``load_records``, none of them held: what
    show, export and compare need at 10^6 cases. Both passes check every line (the first
    only tells which to keep: a bad line raises there, as in ``load_records``); lines
    appended between the passes are not read."""
    last = {record["id"]: number for number, record in journal_records(path)}
    for number, record in journal_records(path):
        if last.get(record["id"]) == number:
            yield record
