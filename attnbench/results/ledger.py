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

import os
import re
import sys
import zlib
from pathlib import Path
from typing import Iterator, NamedTuple

from attnbench.errors import RunDirError
from attnbench.results.journal import (_READ_BUFFER, TORN, JournalLine, journal_lines,
                                       journal_records, line_record, open_journal, read_lines)


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


def last_records(path: Path | str) -> Iterator[dict]:
    """Each case's last record in the journal at ``path``, streamed, in the order of
    :func:`~attnbench.results.store.load_records` (a case where it first appeared): the same
    records, none of them held. What show, export and compare need at 10^6 cases.

    Two passes: the first notes each id's last line (~100 B a case; where it lies, for a case
    recorded more than once) reading ids only (:func:`_line_id`); the second checks every line,
    as ``load_records`` does, and yields each case at its first line, reading a retried case's
    last line where the first pass saw it. Lines appended between the passes are not read; a
    journal rewritten between them raises :class:`RunDirError`, as does a line whose id is
    not the one the first pass read (a record with two ids)."""
    path = Path(path)
    last, lines = _last_lines(path)
    second = SecondPass(path, last, lines)
    try:
        for line in journal_lines(path):
            record = second.take(line)
            if record is TORN:
                return
            if record is not None:
                yield record
    finally:
        second.close()


class SecondPass:
    """:func:`last_records`' second pass, a line at a time: what it yields at each line (also
    for the lines :mod:`~attnbench.results.columnar` cannot take as columns, so a bad line
    says what it says here). ``last`` and ``lines``: pass 1's (:func:`_last_lines`)."""

    def __init__(self, path: Path, last: dict, lines: int):
        self.path, self.last, self.lines = path, last, lines
        self.sent: set[str] = set()  # retried cases already yielded (at their first line)
        self._fd = None

    def take(self, line: JournalLine):
        """The record to yield at ``line``, None for none, :data:`TORN` where the pass ends (a
        torn last line, or past the lines pass 1 read); a bad line raises :class:`RunDirError`."""
        path = self.path
        if line.number > self.lines:
            return TORN
        record = _checked_record(path, line)
        if not isinstance(record, dict):
            return record
        rid = record["id"]
        seen = self.last.get(rid)
        if isinstance(seen, int):  # its only record
            if seen != line.number:
                raise _changed(path, line.number)
            return record
        if seen is not None and rid not in self.sent:  # retried: its last record, here
            self.sent.add(rid)
            if self._fd is None:
                self._fd = open_journal(path)
            return _record_at(path, self._fd, rid, *seen)
        if seen is None:
            raise _changed(path, line.number)
        return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


_ID = re.compile(rb'\{[ \t\r\n]*"id"[ \t\r\n]*:[ \t\r\n]*"([\x20\x21\x23-\x5b\x5d-\x7e]{1,64})"'
                 rb'[ \t\r\n]*[,}]')
"""A line's id as attnbench writes it (:func:`~attnbench.results.records.make_record`: the
first key; a case id is 16 hex digits; JSON's blanks allowed, as ``json.dumps`` puts them):
printable ASCII without quotes or backslashes, so the bytes are the string JSON would decode.
Reading it so costs ~1 us a line; parsing the line ~50 us, checking it ~170 us (issue 29's
notes: 100k lines, a loaded box)."""


def _fast_id(line: JournalLine) -> str | None:
    """The id of a whole line written as :data:`_ID` reads, else None."""
    match = _ID.match(line.data) if line.ended else None
    return match.group(1).decode("ascii") if match else None


def _checked_record(path: Path, line: JournalLine):
    """:func:`line_record` of a line whose id pass 1 read (:func:`_fast_id`): a record whose
    parsed id is another (a second ``"id"`` key later in the line) raises :class:`RunDirError`."""
    record = line_record(path, line)
    if isinstance(record, dict) and _fast_id(line) not in (None, record["id"]):
        raise RunDirError(f"{path}:{line.number}: a record with two ids; not a line attnbench "
                          "wrote")
    return record


def _line_id(path: Path, line: JournalLine):
    """The id of a line's record, read without parsing where it is written as attnbench writes
    it (:func:`_fast_id`), else parsed and checked (:func:`line_record`: None for a blank line,
    :data:`TORN` for a torn last line, a bad line raises); a last line without its newline is
    always parsed (it may be torn)."""
    rid = _fast_id(line)
    if rid is not None:
        return rid
    record = line_record(path, line)
    return record["id"] if isinstance(record, dict) else record


def _last_lines(path: Path, parts: "_Parts | None" = None
                ) -> tuple[dict[str, int | tuple[int, ...]], int]:
    """Case id -> the line number of its only record, or ``(number, offset, length)`` of the
    last of several; and the number of lines read (pass 1 of :func:`last_records`). With
    ``parts``, also what :func:`line_ranges` needs: the last of several is
    ``(number, offset, length, first)``, ``first`` the line of its first record."""
    last: dict[str, int | tuple[int, ...]] = {}
    lines = 0
    for line in journal_lines(path):
        rid = _line_id(path, line)
        if rid is TORN:
            break
        lines = line.number
        if parts is not None:
            parts.note(line, rid)
        if rid is None:
            continue
        seen = last.get(rid)
        if seen is None:
            last[rid] = line.number
        elif parts is None:  # (the first line, 8 B more a retried case: only where asked)
            last[rid] = (line.number, line.offset, len(line.data))
        else:
            last[rid] = (line.number, line.offset, len(line.data),
                         seen if isinstance(seen, int) else seen[3])
            parts.repeats.append(line.number)
    return last, lines


class LineRange(NamedTuple):
    """Lines ``start`` .. ``start + count - 1`` of a journal (the first at byte ``offset``):
    what a process needs to yield, on its own, the records :func:`last_records` yields at
    those lines (:func:`range_records`). Plain data, sent to another process."""

    start: int
    offset: int
    count: int
    digest: int
    """CRC-32 of the ids of its records in order, as pass 1 read them: a journal rewritten
    since (not by appending) reads otherwise."""
    firsts: dict[int, tuple[int, int, int]]
    """Line of a retried case's first record -> ``(number, offset, length)`` of its last:
    yielded there."""
    repeats: frozenset[int]
    """Lines of a retried case after its first: checked, not yielded."""


class _Parts:
    """Where each range of ``every`` lines starts and its ids' digest, noted during pass 1."""

    def __init__(self, every: int):
        self.every = every
        self.starts: list[tuple[int, int]] = []
        self.digests: list[int] = []
        self.repeats: list[int] = []

    def note(self, line: JournalLine, rid: str | None) -> None:
        if line.number % self.every == 1 or self.every == 1:
            self.starts.append((line.number, line.offset))
            self.digests.append(0)
        if rid is not None:
            self.digests[-1] = zlib.crc32(rid.encode("ascii", "replace"), self.digests[-1])


def line_ranges(path: Path | str, every: int) -> list[LineRange]:
    """The journal at ``path`` cut into ranges of ``every`` lines (the last shorter), for
    :func:`range_records` run by several processes: :func:`last_records`' first pass (bad lines
    it reads raise :class:`RunDirError` here), which also notes each range's start, each
    retried case's first line and its other lines."""
    path = Path(path)
    parts = _Parts(every)
    last, lines = _last_lines(path, parts)
    firsts: list[dict[int, tuple[int, int, int]]] = [{} for _ in parts.starts]
    for seen in last.values():
        if not isinstance(seen, int):
            firsts[(seen[3] - 1) // every][seen[3]] = seen[:3]
    repeats: list[set[int]] = [set() for _ in parts.starts]
    for number in parts.repeats:
        repeats[(number - 1) // every].add(number)
    del last
    return [LineRange(start, offset, min(every, lines - start + 1), digest, firsts[i],
                      frozenset(repeats[i]))
            for i, ((start, offset), digest) in enumerate(zip(parts.starts, parts.digests))
            if start <= lines]


def range_records(path: Path | str, part: LineRange) -> Iterator[dict]:
    """The records :func:`last_records` yields at the lines of ``part``, each line checked as
    there: a bad line raises the same :class:`RunDirError`; so does a range whose ids are not
    those pass 1 read (the journal rewritten in between)."""
    path = Path(path)
    fd = open_journal(path)
    digest = 0
    end = part.start + part.count
    with os.fdopen(fd, "rb", buffering=_READ_BUFFER) as fh:
        try:
            fh.seek(part.offset)
            for line in read_lines(fh):
                number = line.number + part.start - 1
                if number >= end:
                    break
                line = line._replace(number=number, offset=line.offset + part.offset)
                record = _checked_record(path, line)
                if record is TORN:
                    break
                if record is None:
                    continue
                rid = record["id"]
                digest = zlib.crc32(rid.encode("ascii", "replace"), digest)
                if number in part.repeats:
                    continue
                seen = part.firsts.get(number)
                yield record if seen is None else _record_at(path, fd, rid, *seen)
        except OSError as exc:
            raise RunDirError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if digest != part.digest:
        raise _changed(path, part.start)


def _record_at(path: Path, fd: int, rid: str, number: int, offset: int, length: int) -> dict:
    """The record of line ``number`` (at ``offset``, ``length`` bytes), checked, whose id
    must be ``rid``."""
    try:
        data = os.pread(fd, length, offset)
    except OSError as exc:
        raise RunDirError(f"{path}: cannot read: {exc.strerror or exc}") from None
    record = line_record(path, JournalLine(number, data, ended=True, offset=offset))
    if not isinstance(record, dict) or record["id"] != rid:
        raise _changed(path, number)
    return record


def _changed(path: Path, number: int) -> RunDirError:
    return RunDirError(f"{path}:{number}: the journal changed while it was read (not by "
                       "appending); read it again")
