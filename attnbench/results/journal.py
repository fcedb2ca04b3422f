"""The one journal reader: ``records.jsonl`` streamed a line at a time, each line capped.

A journal may be large (a long run) or hostile (a shared run directory: one 2 GiB line), so it
is never read whole: :func:`journal_lines` yields its lines one at a time, none longer than
:data:`MAX_LINE_BYTES` held in memory (a longer one is read past in chunks and reported as
such), and :func:`journal_records` parses and checks them. Memory is one line, whatever the
file; what a caller keeps (the last record per case, a count) is its own.

Every reader of a journal goes through here (``load_records``, ``show``, ``report``,
``export``, ``compare``, ``status``), so a bound set here holds for all of them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, NamedTuple

from attnbench.errors import RunDirError, printable
from attnbench.results.schema import check_record
from attnbench.validation import open_regular, parse_json

MAX_LINE_BYTES = 1 << 20
"""The longest journal line read: 1 MiB. A record is about 4.5 KB (the largest of 318 mixed
records of a synthetic run: 4,527 bytes); its longest parts are bounded where they are made (a
traceback's last 4,000 characters, a rank's stderr tail of 40 lines within 64 KiB), so 1 MiB is
over 200 times the largest seen and far above what any writer produces: a longer line was not
written by attnbench."""
_CHUNK = 1 << 16
"""Bytes read at a time when skipping past an over-long line (64 KiB: memory stays bounded)."""
_READ_BUFFER = 1 << 16
"""The read buffer: 64 KiB, fixed. Left to Python it is the file system's block size, which is
4 KiB on a local disk but 1 MiB or more on some network and overlay file systems: a reader's
memory should not depend on where the run directory lies."""


class JournalLine(NamedTuple):
    """One line of a journal: its 1-based ``number``; its bytes without the newline (empty when
    ``oversize``); ``ended`` (it has its newline: a last line without one may be torn by an
    interrupted write); ``oversize`` (longer than the cap: its bytes were not kept);
    ``offset``: where it starts in the file (a reader may come back to it). A named tuple, not
    a frozen dataclass: made twice a line by ``last_records``, ~0.3 us each, not ~1.4."""

    number: int
    data: bytes
    ended: bool
    oversize: bool = False
    offset: int = 0


def read_lines(fh: BinaryIO, limit: int = MAX_LINE_BYTES) -> Iterator[JournalLine]:
    """The lines of an open binary file, each held only while it is looked at; a line longer
    than ``limit`` bytes is skipped through in chunks and yielded as ``oversize``."""
    number = offset = 0
    while True:
        data = fh.readline(limit + 1)
        if not data:
            return
        number += 1
        start, offset = offset, offset + len(data)
        if len(data) <= limit or (len(data) == limit + 1 and data.endswith(b"\n")):
            ended = data.endswith(b"\n")
            yield JournalLine(number, data[:-1] if ended else data, ended, offset=start)
            continue
        ended = False
        while not ended:  # skip the rest of the long line without keeping it
            chunk = fh.readline(_CHUNK)
            if not chunk:
                break
            offset += len(chunk)
            ended = chunk.endswith(b"\n")
        yield JournalLine(number, b"", ended, oversize=True, offset=start)


def open_journal(path: Path) -> int:
    """A read-only descriptor of the journal at ``path``. Raises :class:`RunDirError` (one
    line) when it cannot be opened or is not a regular file (a FIFO is not waited on)."""
    try:
        return open_regular(path)
    except OSError as exc:
        raise RunDirError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValueError:
        raise RunDirError(f"{path}: not a file; the journal must be one") from None


def journal_lines(path: Path | str, limit: int = MAX_LINE_BYTES) -> Iterator[JournalLine]:
    """:func:`read_lines` of the journal at ``path`` (opened by :func:`open_journal`)."""
    path = Path(path)
    fd = open_journal(path)
    with os.fdopen(fd, "rb", buffering=_READ_BUFFER) as fh:
        try:
            yield from read_lines(fh, limit)
        except OSError as exc:
            raise RunDirError(f"{path}: cannot read: {exc.strerror or exc}") from None


def journal_records(path: Path | str, limit: int = MAX_LINE_BYTES
                    ) -> Iterator[tuple[int, dict]]:
    """``(line number, record)`` for each record of the journal at ``path``, in file order,
    each checked (:func:`check_record`); blank lines are passed over and a torn last line
    (no newline, not a record) is skipped. Anything else that is not a record -- a line over
    ``limit``, not UTF-8, not JSON, a bad field -- raises :class:`RunDirError` naming the file
    and line."""
    path = Path(path)
    for line in journal_lines(path, limit):
        record = line_record(path, line, limit)
        if record is TORN:
            return
        if record is not None:
            yield line.number, record


TORN = object()
""":func:`line_record` of a torn last line: the journal ends before it."""


def line_record(path: Path, line: JournalLine, limit: int = MAX_LINE_BYTES):
    """The checked record of one line of the journal at ``path`` (what :func:`journal_records`
    yields), None for a blank line, :data:`TORN` for a torn last line; anything else raises
    :class:`RunDirError` naming the file and line."""
    where = f"{path}:{line.number}"
    if line.oversize:
        raise RunDirError(f"{where}: a line of more than {limit} bytes; a record is at most "
                          "a few KB, so this is not a record attnbench wrote")
    if not line.data.strip():
        return None
    try:
        record = parse_line(line.data)
    except (ValueError, UnicodeDecodeError) as exc:
        if not line.ended:
            return TORN  # torn by an interruption mid-write
        why = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else "not a JSON record"
        raise RunDirError(f"{where}: {why} ({printable(exc, 200)})") from None
    check_record(f"{where}: ", record)
    return record


def _number_shapes() -> bytes:
    """A :meth:`bytes.translate` table: digits to ``0``, ``e``/``E`` to ``e``, ``.`` kept,
    every other byte a blank (``+`` is deleted: ``1e+309`` reads ``0e000``)."""
    table = bytearray(b" " * 256)
    for digit in b"0123456789":
        table[digit] = ord("0")
    table[ord("E")] = table[ord("e")] = ord("e")
    table[ord(".")] = ord(".")
    return bytes(table)


_SHAPES = _number_shapes()
_DIGITS_19 = b"0" * 19
_LONG_INTEGER = b" " + _DIGITS_19
"""An integer part of 19 digits or more (int64 has 19): after a blank, as a number's start is
(``:``, ``,``, ``[``, ``-`` and white space are blanks; a fraction's digits follow ``.``).
Looked for only where 19 digits follow one another (a quicker search: ~0.5 us, not 1.5)."""
_LONG_EXPONENT = b"e000"
"""An exponent of 3 digits or more: the only other way to a float that overflows (1e309)."""


def _refuse(name: str):
    raise ValueError(name)  # NaN, Infinity: refused by parse_json, which says so


_PLAIN = json.JSONDecoder(parse_constant=_refuse)


def _plain(data: bytes):
    return _PLAIN.decode(data.decode("utf-8"))


try:  # orjson parses a record in ~8 us, json in ~30: a third of reading 10^6 records
    from orjson import loads as _plain_loads
except ImportError:  # the same values without it (a box that brings its own environment)
    _plain_loads = _plain


def parse_line(data: bytes, plain: Callable[[bytes], Any] | None = None):
    """:func:`~attnbench.validation.parse_json` of a journal line's bytes, decoded as UTF-8:
    the same value, or the same exception. Its hooks refuse a float that overflows and an
    integer beyond int64, but a Python call per number is ~30% of parsing a record (~20 numbers
    a line); so a line whose numbers cannot be either (no integer part of 19 digits, no
    exponent of 3: looked for in C, ~2 us, digits in strings counted too) is parsed without
    them, and any other line, or one that does not parse, by ``parse_json`` itself.

    ``plain`` parses those lines: orjson where installed, else json without hooks. Where both
    accept a line they give the same value (floats correctly rounded by both); what orjson
    refuses and json takes (a lone surrogate, NaN, 1e309) goes to ``parse_json``, and what
    orjson takes differently (an integer under -2^63, as a float) never reaches it: 19 digits.
    orjson refuses bytes that are not UTF-8, so a line it parses decodes."""
    shapes = data.translate(_SHAPES, b"+")
    if data[:1] == b"{" and _LONG_EXPONENT not in shapes \
            and (_DIGITS_19 not in shapes or _LONG_INTEGER not in shapes):
        try:
            return (plain or _plain_loads)(data)
        except (ValueError, RecursionError, UnicodeDecodeError):
            pass  # said below, as parse_json says it
    return parse_json(data.decode("utf-8"))


MAX_FIELD_CHARS = 1 << 16
"""A text of a record longer than this (64 Ki characters) is cut when the record would not fit
on a journal line (:func:`fit_line`): the longest text attnbench makes is a rank's stderr tail,
64 KiB at most; a longer one is an exception's message quoting a whole tensor or file."""


def fit_line(record: dict, text: str) -> tuple[dict, str]:
    """``record`` and its JSON ``text``, unchanged when ``text`` fits :data:`MAX_LINE_BYTES`;
    else every string in it over :data:`MAX_FIELD_CHARS` cut (with a note of how much), so what
    is written can be read back. Raises :class:`RunDirError` if it still does not fit."""
    if 4 * len(text) < MAX_LINE_BYTES or len(text.encode("utf-8")) < MAX_LINE_BYTES:
        return record, text  # (a character is at most 4 bytes: most records skip the encoding)
    record = _cut(record)
    text = json.dumps(record, separators=(",", ":"), allow_nan=False)
    if len(text.encode("utf-8")) + 1 > MAX_LINE_BYTES:
        raise RunDirError(f"record {printable(record.get('id'), 64)}: {len(text)} characters "
                          f"with its texts cut, more than a journal line holds "
                          f"({MAX_LINE_BYTES} bytes)")
    return record, text


def _cut(value):
    if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
        return f"{value[:MAX_FIELD_CHARS]} [... {len(value) - MAX_FIELD_CHARS} more characters cut]"
    if isinstance(value, dict):
        return {k: _cut(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut(v) for v in value]
    return value
