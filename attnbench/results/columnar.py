"""The journal's records as Arrow columns, a block of lines at a time, where that is exact.

:func:`last_record_blocks` yields what :func:`~attnbench.results.ledger.last_records` yields,
but a block of ~4 MiB of clean lines comes as one :class:`RecordBlock` (an Arrow table, a row a
record, in journal order) instead of ~3,500 dicts: pyarrow parses and types it in C
(~16 us a record on a loaded box, the checks below ~7 more, where a parse and a check in
Python cost ~30 and the dicts the rest; benchmarks/readers.md, issue 44), and a reader
aggregates its columns. The journal stays the truth: nothing is kept of it.

A block is taken as columns only where the per-line path would pass every line and read the
same values; anything else is read line by line (:class:`~attnbench.results.ledger.
SecondPass`), so a bad line is named, with its file and line, by the very message it always
had. Taken as columns only:

- bytes that JSON and pyarrow read alike: printable ASCII, no escapes (no backslash), no NaN
  or Infinity, no number that may overflow (:func:`~attnbench.results.journal.parse_line`'s
  shapes), a line a record (each line starts with ``{`` and parses to one row), none over
  :data:`~attnbench.results.journal.MAX_LINE_BYTES`;
- an explicit schema (:data:`SCHEMA`, from :mod:`~attnbench.results.schema`'s tables and the
  case's fields): a field of another type, a key it does not name, a key twice make pyarrow
  refuse the block; an int where a case field is a float (``dropout: 0``: its text is ``0``,
  not ``0.0``) is looked for in the bytes; every case field, label and reason present and not
  null (null and absent are one in Arrow, not in Python);
- the schema's values checked as :func:`~attnbench.results.schema.check_record` checks them:
  ids of 1-64 characters, known verdicts, attempts >= 1, no null in a list of numbers, each
  distinct case value through its field's rule (:func:`~attnbench.sweep.case.
  case_value_passes`), cp * tp within bounds;
- every record its case's only one, on the line pass 1 read it (a retried case, or a journal
  changed between the passes, is the per-line path's to say).

Without pyarrow (a box with its own environment) every line goes the per-line path.
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
from pathlib import Path
from typing import Iterator, NamedTuple

from attnbench.errors import RunDirError
from attnbench.results.journal import (_LONG_EXPONENT, _LONG_INTEGER, _SHAPES, MAX_LINE_BYTES,
                                       TORN, JournalLine, open_journal, read_lines)
from attnbench.results.ledger import SecondPass, _last_lines
from attnbench.results import schema
from attnbench.results.records import IDENTITIES, TENSORS, VERDICTS
from attnbench.sweep.case import MAX_RANKS, Case, case_value_passes

try:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj
except ImportError:  # the per-line path alone
    pa = None

BLOCK_BYTES = 4 << 20
"""Bytes read and parsed at a time: ~3,500 records of ~1.2 KB, ~10 MB of Arrow columns."""
MISSES = 3
"""Blocks in a row that cannot be columns before only one block in :data:`RETRY` is tried
(a journal of records this schema does not cover costs a parse every 16 blocks, not one a
block; a journal clean again after a stretch that was not is read as columns again)."""
RETRY = 16

_CASE_TYPES = {"int": "int64", "float": "float64", "bool": "bool_", "str": "string"}
CASE_COLUMNS = {f.name: _CASE_TYPES[f.type] for f in dataclasses.fields(Case)
                if f.type in _CASE_TYPES}
"""Case field -> its Arrow type (the packed lengths, lists, are not: a case with them is read
line by line)."""
_FLOAT_FIELDS = tuple(name for name, kind in CASE_COLUMNS.items() if kind == "float64")
_NULLS_READ = ("label", "reason")
"""Keys whose null a reader tells from its absence (``r.get("label", "")``), as it does a case
field's (``case.get("seqlen_kv")`` of a case without it is its default): a block where one is
null or absent is read line by line."""

_ODD = tuple(re.compile(rb'"' + re.escape(name.encode("ascii"))
                        + rb'"[ \t\r]*:[ \t\r]*(?:-|[0-9]+[ \t\r]*[,}])')
             for name in _FLOAT_FIELDS)
"""An int where a case field is a float (its text is ``0``, not ``0.0``), or a negative one
(-0.0 has a text of its own, but Arrow groups it with 0.0). With no backslash in the block
a quote is a string's end, so ``"dropout":`` is a key (of some object: a false alarm costs the
block its columns, never a value). One pattern a field: a literal start is searched in C."""
_STOPS = (b"\\", b"NaN", b"Infinity")


def _arrow_types():
    """Kind (:mod:`~attnbench.results.schema`'s) -> Arrow type; a scalar of any type is typed
    as JSON writes it (a metric: a float; a check's ``passed``: a flag; a tensor's
    ``baseline``: its name): another type refuses the block."""
    return {schema.TEXT: pa.string(), schema.NUMBER: pa.float64(), schema.FLAG: pa.bool_(),
            schema.SCALAR: pa.float64(), schema.NUMBERS: pa.list_(pa.float64())}


_SCALAR_TYPES = {"baseline": "string", "passed": "bool_", "dirty": "bool_",
                 "ecc_enabled": "bool_"}


def _struct(fields: dict[str, str], children: dict | None = None):
    types = _arrow_types()
    out = [pa.field(k, getattr(pa, _SCALAR_TYPES[k])() if kind == schema.SCALAR
                    and k in _SCALAR_TYPES else types[kind]) for k, kind in fields.items()]
    return pa.struct(out + [pa.field(k, v) for k, v in (children or {}).items()])


def _schema():
    s = schema
    metrics = _struct(s._METRICS)
    env_extra = {"simulated": pa.bool_(), "lease": pa.list_(pa.string()),
                 "lease_start": pa.float64(), "lease_end": pa.float64()}
    timing = _struct(s._TIMING, {"fwd": _struct(s._STATS), "bwd": _struct(s._STATS),
                                 "clocks_fwd": _struct(s._CLOCKS),
                                 "clocks_bwd": _struct(s._CLOCKS)})
    case = pa.struct([pa.field(k, getattr(pa, t)()) for k, t in CASE_COLUMNS.items()])
    return pa.schema([
        pa.field("id", pa.string()), pa.field("case", case), pa.field("verdict", pa.string()),
        *(pa.field(k, pa.string() if kind == s.TEXT else pa.float64())
          for k, kind in s._RECORD.items()),
        pa.field("attempt", pa.int64()),
        pa.field("checks", pa.list_(_struct(s._CHECK))),
        pa.field("accuracy", _struct({"reference": s.TEXT}, {
            "tensors": pa.struct([pa.field(t, metrics) for t in TENSORS]),
            "identities": pa.struct([pa.field(t, metrics) for t in IDENTITIES])})),
        pa.field("timing", timing),
        pa.field("crash", _struct(s._CRASH)),
        pa.field("compile", _struct(s._COMPILE)),
        pa.field("env", pa.struct(list(_struct(s._ENV)) + [
            pa.field("identity", _struct(s._IDENTITY)),
            pa.field("software", _struct(s._SOFTWARE)),
            *(pa.field(k, v) for k, v in env_extra.items())]))])


SCHEMA = _schema() if pa is not None else None
"""The records a block may hold, every field typed (pyarrow infers nothing): see the module
docstring. A record with a key it does not name is read line by line."""


class RecordBlock(NamedTuple):
    """Records of consecutive journal lines, each its case's only record: ``table`` (a row a
    record, typed by :data:`SCHEMA`; null where a record lacks a field) and ``first``, the line
    of its first row (row i is line ``first + i``)."""

    table: "pa.Table"
    first: int


def last_record_blocks(path: Path | str, columns: bool = True
                       ) -> Iterator["dict | RecordBlock"]:
    """:func:`~attnbench.results.ledger.last_records` of the journal at ``path``, where it can
    be exact as :class:`RecordBlock` s (see the module docstring), else as records: the same
    records in the same order; a bad line raises the same :class:`RunDirError`.
    ``columns=False``: records only (the per-line path, for tests and comparisons)."""
    path = Path(path)
    last, lines = _last_lines(path)
    second = SecondPass(path, last, lines)
    try:
        yield from _read(path, second, columns and pa is not None)
    finally:
        second.close()


def _read(path: Path, second: SecondPass, columns: bool) -> Iterator["dict | RecordBlock"]:
    fd = open_journal(path)
    misses = 0
    with os.fdopen(fd, "rb", buffering=0) as fh:
        number = offset = 0  # lines and bytes before ``carry``
        carry = b""
        while True:
            try:
                data = fh.read(BLOCK_BYTES)
            except OSError as exc:
                raise RunDirError(f"{path}: cannot read: {exc.strerror or exc}") from None
            if not data:
                break
            buf = carry + data
            end = buf.rfind(b"\n") + 1
            block, carry = buf[:end], buf[end:]
            if block:
                count = block.count(b"\n")
                table = _columns(block, count, number + 1, second) \
                    if columns and (misses < MISSES or misses % RETRY == 0) else None
                misses = 0 if table is not None else misses + 1
                if table is not None:
                    yield RecordBlock(table, number + 1)
                else:
                    for line in _split(block, number, offset):
                        record = second.take(line)
                        if record is TORN:
                            return
                        if record is not None:
                            yield record
                number, offset = number + count, offset + end
            if len(carry) > MAX_LINE_BYTES:  # a line too long to hold: the per-line reader
                yield from _tail(path, second, number, offset)
                return
        if carry:  # a last line without its newline (torn, perhaps)
            record = second.take(JournalLine(number + 1, carry, False, offset=offset))
            if isinstance(record, dict):
                yield record


def _split(block: bytes, number: int, offset: int) -> Iterator[JournalLine]:
    for i, data in enumerate(block[:-1].split(b"\n")):
        if len(data) > MAX_LINE_BYTES:  # as read_lines says it
            yield JournalLine(number + i + 1, b"", True, oversize=True, offset=offset)
        else:
            yield JournalLine(number + i + 1, data, True, offset=offset)
        offset += len(data) + 1


def _tail(path: Path, second: SecondPass, number: int, offset: int) -> Iterator[dict]:
    """The lines from ``offset`` (line ``number + 1``) on, read by
    :func:`~attnbench.results.journal.read_lines` (an over-long line skipped through in
    chunks, as the per-line path does)."""
    with os.fdopen(open_journal(path), "rb", buffering=1 << 16) as fh:
        fh.seek(offset)
        for line in read_lines(fh):
            line = line._replace(number=line.number + number, offset=line.offset + offset)
            record = second.take(line)
            if record is TORN:
                return
            if record is not None:
                yield record


def _columns(block: bytes, count: int, first: int, second: SecondPass):
    """The block's records as a table, or None where one of them might read otherwise than
    by the per-line path (see the module docstring)."""
    if first + count - 1 > second.lines or not _plain(block):
        return None
    codes = np.frombuffer(block, np.uint8)
    ends = np.flatnonzero(codes == 10)
    starts = np.concatenate(([0], ends[:-1] + 1))
    if int(np.count_nonzero((codes < 32) | (codes > 126))) != len(ends) \
            or not bool(np.all(codes[starts] == ord("{"))) \
            or int((ends - starts).max()) > MAX_LINE_BYTES:
        return None  # a control byte, non-ASCII, a blank line or not an object, a long line
    try:
        table = pj.read_json(io.BytesIO(block), read_options=pj.ReadOptions(
            use_threads=False, block_size=len(block) + 1), parse_options=pj.ParseOptions(
            explicit_schema=SCHEMA, unexpected_field_behavior="error"))
    except (pa.ArrowException, ValueError):
        return None
    if table.num_rows != count:
        return None
    table = table.combine_chunks()
    if not (_checked(table) and _own_lines(table, first, second.last)):
        return None
    return table


def _plain(block: bytes) -> bool:
    """No escape, NaN or number that may overflow; no int Arrow would read as a float
    (:data:`_ODD`)."""
    if any(stop in block for stop in _STOPS) or not _numbers_fit(block):
        return False
    return not any(pattern.search(block) for pattern in _ODD)


_BLOCK_SHAPES = _SHAPES[:ord("+")] + b"e" + _SHAPES[ord("+") + 1:]
""":data:`~attnbench.results.journal._SHAPES` with ``+`` read as ``e`` (not deleted: a shape's
place is its byte's), so ``1e+309`` reads ``0ee000``."""


def _numbers_fit(block: bytes) -> bool:
    """No integer of 19 digits or more, no exponent of 3 digits, outside a string (an even
    count of quotes before it: the block has no backslash, and a line of an odd count does not
    parse): what :func:`~attnbench.results.journal.parse_line` leaves to ``parse_json``. Ids
    such as ``...e000`` are shapes in strings; the quotes are counted once per block."""
    shapes = block.translate(_BLOCK_SHAPES)
    for pattern, skip in ((_LONG_EXPONENT, 0), (_LONG_INTEGER, 1)):
        at, counted, quotes = shapes.find(pattern), 0, 0
        while at >= 0:
            quotes += block.count(b'"', counted, at + skip)
            counted = at + skip
            if quotes % 2 == 0:
                return False
            at = shapes.find(pattern, at + 1)
    return True


def _checked(table) -> bool:
    """:func:`~attnbench.results.schema.check_record`'s rules that the types do not hold."""
    ids, verdicts = table.column("id").chunk(0), table.column("verdict").chunk(0)
    if ids.null_count or verdicts.null_count:
        return False
    lengths = pc.binary_length(ids)
    if pc.min(lengths).as_py() < 1 or pc.max(lengths).as_py() > 64:
        return False
    if not pc.all(pc.is_in(verdicts, value_set=pa.array(VERDICTS))).as_py():
        return False
    attempt = pc.min(table.column("attempt")).as_py()
    if attempt is not None and attempt < 1:
        return False
    for numbers in _number_lists(table):
        if numbers.null_count:
            return False
    case = table.column("case").chunk(0)
    if case.null_count or any(case.field(name).null_count for name in CASE_COLUMNS) \
            or any(table.column(key).null_count for key in _NULLS_READ):
        return False  # null or absent: Arrow does not tell them apart
    for name in CASE_COLUMNS:
        values = pc.unique(case.field(name)).to_pylist()
        if not all(v is None or case_value_passes(name, v) for v in values):
            return False
    ranks = pc.multiply(pc.fill_null(case.field("cp"), 1), pc.fill_null(case.field("tp"), 1))
    return len(ranks) == 0 or pc.max(ranks).as_py() <= MAX_RANKS


def _number_lists(table) -> Iterator:
    """The values of every list of numbers in ``table`` (a null among them is not a number)."""
    def walk(array, kind):
        if pa.types.is_struct(kind):
            for i in range(kind.num_fields):
                yield from walk(array.field(i), kind.field(i).type)
        elif pa.types.is_list(kind) and pa.types.is_floating(kind.value_type):
            yield array.flatten()

    for column, field in zip(table.columns, table.schema):
        yield from walk(column.chunk(0), field.type)


def _own_lines(table, first: int, last: dict) -> bool:
    """Every row's id is that of a case recorded once, on this row's line (pass 1's)."""
    get = last.get
    return all(get(rid) == first + i for i, rid in enumerate(table.column("id").to_pylist()))


def block_records(block: RecordBlock, rows=None) -> list[dict]:
    """Rows of a block (all, or those at the indices ``rows``) as records, as a reader of a
    record reads them: every case field, label and reason as on its line (a block has them
    all); another field absent from the line is None, as a null would be."""
    table = block.table if rows is None else block.table.take(rows)
    return table.to_pylist()
