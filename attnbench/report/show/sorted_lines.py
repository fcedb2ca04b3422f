"""Lines of text sorted by a key, stably, in bounded memory: ``show --all`` of 10^6 cases.

:class:`SortedLines` takes ``(key, line)`` pairs in any number and gives the lines back in the
order of ``sorted(pairs, key=first)`` (equal keys in the order they came). Up to :data:`CHUNK`
pairs it is that sort in memory; beyond, each chunk is sorted and written to a temporary file
(one JSON array per line) and the files are merged (``heapq.merge``), so memory is a chunk and
one pair per file, whatever the count.
"""

from __future__ import annotations

import heapq
import json
import tempfile
from typing import Iterator

CHUNK = 50_000
"""Pairs held before a chunk is written out: ~20 MB of ~150-byte lines and labels (issue 29's
journal: 1M cases are 20 files, ~0.3 GB of disk for a moment)."""


class SortedLines:
    """See the module docstring. Iterate once, then :meth:`close` (or use ``with``)."""

    def __init__(self, chunk: int | None = None) -> None:
        self._chunk = chunk or CHUNK
        self._pairs: list[tuple[str, int, str]] = []
        self._files: list = []
        self._count = 0

    def add(self, key: str, line: str) -> None:
        self._pairs.append((key, self._count, line))  # the count keeps equal keys in order
        self._count += 1
        if len(self._pairs) >= self._chunk:
            self._spill()

    def _spill(self) -> None:
        fh = tempfile.TemporaryFile("w+", encoding="utf-8")  # gone when closed, also on a kill
        self._files.append(fh)
        for pair in sorted(self._pairs):
            fh.write(json.dumps(pair) + "\n")
        self._pairs = []

    def __iter__(self) -> Iterator[str]:
        if not self._files:
            for *_, line in sorted(self._pairs):
                yield line
            return
        if self._pairs:
            self._spill()
        for fh in self._files:
            fh.seek(0)
        for _, _, line in heapq.merge(*(map(json.loads, fh) for fh in self._files)):
            yield line

    def close(self) -> None:
        for fh in self._files:
            fh.close()
        self._files = []

    def __enter__(self) -> "SortedLines":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
