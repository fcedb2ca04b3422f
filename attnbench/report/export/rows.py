"""``attnbench export --format csv`` and ``json`` without a frame: the rows written at once.

pandas' ``to_csv`` of :func:`~attnbench.report.export.command.export_frame` writes a cell as the
column's type decides (issue 29: frames and ``to_csv`` were ~60 % of export's 163 s at 10^6
rows; the JSON path's ``to_dict`` as slow). Its cells (and JSON's values), for the values a flattened row holds (str, int, float, bool, None, dicts,
lists, tuples), read the same whatever the type but in two cases:

- ``F``, a float64 column (numbers with a None, NaN or a float): an int is a float, ``139.0``;
- ``I``, a count column made ``Int64``
  (:func:`~attnbench.report.export.command._counts_as_integers`): a whole float is an int, ``6``;
- ``N``, any other: an int ``139``, a float its repr (numpy's ``astype(str)`` of a float64 is
  the repr: checked on 4*10^5 random doubles), NaN and None empty, a dict or list JSON text
  (in JSON: NaN, the infinities and None null, a dict or list itself).

So each chunk of rows is written at once, in a temporary file, as the columns' types would be
if the table ended there (:func:`~attnbench.report.export.chunks` keeps one value of each kind
a column holds; the types of those values are the whole table's). Kinds only grow, so a guess
changes a few times at most: when the table's end decides otherwise for a column, the chunks
written before are mended (``N`` or ``I`` to ``F``: an int cell becomes a float; ``N`` to
``I``: a whole float an int) by reading their CSV back. Rows this does not cover -- of several
shapes, a run without rows, an int past 2^53 in a number column, a type change no mending
undoes -- raise :class:`Irregular` before any byte is written, and the frames write them
(:func:`~attnbench.report.export.command.export_chunks`). That the bytes are pandas' is
tests/report/export/test_export_rows.py's oracle.
"""

from __future__ import annotations

import csv
import io
import json
import math
import operator
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple, Sequence

from attnbench.errors import printable
from attnbench.report.export.chunks import _float_kinds, _kind, _kind_rows

EXACT_INT = 2 ** 53
"""Every int up to this is a float64 exactly: past it, an int read as a float rounds, and the
mending below (int -> float -> text) would not be the frame's rounding of the value."""
LINE_END = "\n"
"""As ``csv_chunks`` asks pandas (``lineterminator="\\n"``)."""

_MENDS = {("N", "F"): "float", ("I", "F"): "float", ("N", "I"): "int"}
"""(format a chunk was written in, the table's) -> how its number cells are mended; any other
change of a column holding numbers is :class:`Irregular`."""


def printable_cells(col: Sequence[Any]) -> Sequence[Any]:
    """A column's text cells as every other output prints them (:func:`~attnbench.errors.
    printable`: ESC, CR, newline, bidirectional overrides as visible escapes), so a CSV shown
    in a terminal cannot move its cursor or recolour it; ``col`` itself when none needs it
    (checked in C: one join of its strings). JSON escapes them itself; Parquet keeps them."""
    strs = [v for v in col if type(v) is str]
    if not strs or "".join(strs).isprintable():
        return col
    return [printable(v) if type(v) is str else v for v in col]


def scalar(value: Any) -> Any:
    """A cell as CSV and Parquet can hold it: dicts and lists become JSON text."""
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True)
    return value


_INFINITIES = frozenset((math.inf, -math.inf))


class Irregular(Exception):
    """Rows :class:`RowSpool` does not write as the frame would: the frames path writes them."""


class Piece(NamedTuple):
    """A chunk one worker wrote (:meth:`RowSpool.piece`): its rows' bytes and what
    :meth:`RowSpool.chunks` needs to mend them; no record, no row."""

    kinds: dict[str, dict[Any, Any]]
    """Column -> one value of each kind it holds (:func:`_note`)."""
    columns: tuple[str, ...]
    """The rows' keys, in their order."""
    order: tuple[str, ...]
    """The columns as written (the table's order, as this chunk alone types it)."""
    formats: tuple[str, ...]
    numeric: frozenset[int]
    big: frozenset[int]
    used: tuple[frozenset[str], ...]
    data: bytes


FormatsOf = Callable[[list[list[dict[str, Any]]]], tuple[list[str], list[str]]]
"""Kind rows per run -> (the table's columns in order, their formats ``F`` / ``I`` / ``N``)."""


class RowSpool:
    """The runs' rows as CSV in a temporary file, a chunk at a time, and what each chunk
    assumed of its columns' formats."""

    def __init__(self, formats_of: FormatsOf, chunk_rows: int, fmt: str = "csv") -> None:
        self._json = fmt == "json"
        """JSON rows (:func:`~attnbench.report.export.command.json_chunks`' bytes), else CSV."""
        self._formats_of = formats_of
        self._chunk_rows = chunk_rows
        self._file = tempfile.TemporaryFile()  # gone when closed, also when killed
        self._kinds: list[dict[str, dict[Any, Any]]] = []
        self._kind_count = -1
        self._columns: tuple[str, ...] | None = None
        """The rows' keys (every row has the same, in this order)."""
        self._order: list[str] = []
        self._own: Callable[[dict], tuple] | None = None
        self._from: list[int] = []
        """Per column of the table, its place in the rows' own order."""
        self._formats: tuple[str, ...] = ()
        self._chunks: list[tuple[int, tuple[str, ...], frozenset[int]]] = []
        """Per chunk: its bytes, the formats it was written in, its columns holding numbers."""
        self._big: set[int] = set()
        """Columns holding an int past :data:`EXACT_INT`."""
        self._used: list[set[str]] = []
        self._shared: dict[Any, Any] = {}
        """Pieces' formats and number-column sets, one of each (:meth:`add_piece`)."""

    def add_run(self, rows: Iterator[dict[str, Any]],
                kinds: dict[str, dict[Any, Any]] | None = None) -> None:
        """The run's rows; ``kinds``: those of its rows before these (a worker's rows follow
        others: :mod:`~attnbench.report.export.pool`), typed with them."""
        self._kinds.append({} if kinds is None else kinds)
        chunk: list[dict[str, Any]] = []
        for row in rows:
            chunk.append(row)
            if len(chunk) >= self._chunk_rows:
                self._write(chunk)
                chunk = []
        if chunk:
            self._write(chunk)
        elif not self._kinds[-1]:
            raise Irregular("a run without rows")  # its empty frame types every column object

    def _write(self, rows: list[dict[str, Any]]) -> None:
        keys = rows[0].keys()
        if len(keys) < 2 or not all(row.keys() == keys for row in rows) \
                or self._columns is not None and keys != set(self._columns):
            raise Irregular("rows of several shapes")
        if self._columns is None:
            self._columns = tuple(keys)
            self._own = operator.itemgetter(*self._columns)
        cols = list(zip(*map(self._own, rows)))  # a column at a time: C-speed type sets
        kinds = self._kinds[-1]
        types = [set(map(type, col)) for col in cols]
        for name, col, col_types in zip(self._columns, cols, types):
            _note(kinds.setdefault(name, {}), col, col_types)
        self._guess()
        numeric = set()
        out_cols = []
        for j, fmt in enumerate(self._formats):
            col, has_number = self._cells(j, cols[self._from[j]], fmt, types[self._from[j]])
            out_cols.append(col)
            if has_number:
                numeric.add(j)
            self._used[j].add(fmt)
        cols = out_cols if self._json else list(map(printable_cells, out_cols))
        if self._json:
            order = self._order
            data = ",\n".join([json.dumps(dict(zip(order, row)), allow_nan=False)
                                for row in zip(*cols)]).encode("utf-8")
        else:
            out = io.StringIO()
            csv.writer(out, lineterminator=LINE_END).writerows(zip(*cols))
            data = out.getvalue().encode("utf-8")
        self._file.write(data)
        if b"\r" in data and not self._json:  # the writer quotes no lone CR (lineterminator "\n"): not re-read
            numeric.add(-1)
        self._chunks.append((len(data), self._formats, frozenset(numeric)))

    def _guess(self) -> None:
        """The columns' formats as the table read so far types them (again only when a column
        gained a kind: a few times a table)."""
        count = sum(len(k) for kinds in self._kinds for k in kinds.values())
        if count == self._kind_count:
            return
        self._kind_count = count
        order, formats = self._formats_of([_kind_rows(k) for k in self._kinds])
        if self._order and order != self._order or set(order) != set(self._columns):
            raise Irregular("columns changed")
        if not self._order:
            self._order = order
            self._from = [self._columns.index(c) for c in order]
            self._used = [set() for _ in order]
        self._formats = tuple(formats)  # one tuple shared by the chunks written in it

    def _cells(self, j: int, col: tuple, fmt: str, types: set[type]
               ) -> tuple[Sequence[Any], bool]:
        """A column's values of one chunk (of these types) as the CSV writer should print
        them (NaN: None, which it prints empty; see the module's formats), and whether it
        holds a number."""
        if float not in types and int not in types:
            if types & {dict, list, tuple} and not self._json:
                return list(map(scalar, col)), False
            return col, False
        if int in types:
            ints = col if len(types) == 1 else [v for v in col if type(v) is int]
            if max(ints) > EXACT_INT or min(ints) < -EXACT_INT:
                self._big.add(j)
        if self._json and float in types:  # strict JSON: the infinities null too
            col = [None if v in _INFINITIES else v for v in col]
            types = set(map(type, col))
            if float not in types and int not in types:
                return col, False
        if types == {float}:
            if not any(map(math.isnan, col)):
                if fmt != "I":
                    return col, True
            elif all(map(math.isnan, col)):
                return (None,) * len(col), False
        if fmt == "F":
            return [None if v != v else float(v) if type(v) is int else v for v in col], True
        if fmt == "I":
            return [None if v != v else int(v) if type(v) is float else v for v in col], True
        if types & {dict, list, tuple} and not self._json:
            col = list(map(scalar, col))
        return [None if v != v else v for v in col], True

    def chunks(self) -> Iterator[bytes]:
        """The CSV: the header, then each chunk as written or mended to the table's formats.
        Raises :class:`Irregular` (now, not when iterated) where a chunk cannot be mended."""
        final = self._formats
        for j in self._big:
            if self._used[j] | {final[j]} != {"N"}:
                raise Irregular("an int past 2^53 in a number column")
        mends = []
        for size, formats, numeric in self._chunks:
            mend = []
            for j in numeric:
                if j >= 0 and formats[j] != final[j]:
                    how = _MENDS.get((formats[j], final[j]))
                    if how is None:
                        raise Irregular(f"column {self._order[j]}: {formats[j]} -> {final[j]}")
                    mend.append((j, how))
            if mend and -1 in numeric:
                raise Irregular("a chunk to mend holds a carriage return, which CSV cannot "
                                "read back as written")
            mends.append((size, mend))
        return self._written(mends)

    def _written(self, mends: list[tuple[int, list[tuple[int, str]]]]) -> Iterator[bytes]:
        if self._json:
            yield b"[\n"
        else:
            header = io.StringIO()
            csv.writer(header, lineterminator=LINE_END).writerow(self._order)
            yield header.getvalue().encode("utf-8")
        mend_chunk = _mended_json if self._json else _mended
        self._file.seek(0)
        for i, (size, mend) in enumerate(mends):
            data = self._file.read(size)
            if mend:
                data = mend_chunk(data, [(j, self._order[j], how) for j, how in mend])
            yield b",\n" + data if self._json and i else data
        if self._json:
            yield b"\n]\n"

    def piece(self) -> "Piece":
        """What this spool of one run wrote in one chunk (a worker's, in its own formats:
        :mod:`~attnbench.report.export.pool`), as plain data."""
        size, formats, numeric = self._chunks[0]
        self._file.seek(0)
        return Piece(self._kinds[0], self._columns, tuple(self._order), formats, numeric,
                     frozenset(self._big), tuple(map(frozenset, self._used)),
                     self._file.read(size))

    def known_kinds(self) -> dict[str, dict[Any, Any]]:
        """A copy of the kinds of the pieces added so far to this run."""
        return {name: dict(seen) for name, seen in self._kinds[-1].items()}

    def new_run(self) -> None:
        """The pieces added next are another run's."""
        self._kinds.append({})

    def add_piece(self, piece: "Piece") -> None:
        """A chunk a worker wrote (:meth:`piece`), the next in the table. Its formats are
        its own chunk's guess; :meth:`end_pieces` takes the table's, and :meth:`chunks`
        mends to them as to a guess of the rows before it."""
        if self._columns is None:
            self._columns = piece.columns
            self._order = list(piece.order)
            self._used = [set() for _ in piece.order]
        if set(piece.columns) != set(self._columns):
            raise Irregular("rows of several shapes")
        if list(piece.order) != self._order:
            raise Irregular("columns changed")
        kinds = self._kinds[-1]
        for name in self._columns:  # in the first chunk's order, as _write notes them
            seen = kinds.setdefault(name, {})
            for kind, value in piece.kinds[name].items():
                seen.setdefault(kind, value)
        self._big |= piece.big
        for used, formats in zip(self._used, piece.used):
            used |= formats
        self._file.write(piece.data)
        # a few distinct formats and number-column sets: one of each kept, not one a piece
        # (~2 KB each: at 10^6 lines in pieces of 2,000, ~2 MB)
        formats = self._shared.setdefault(piece.formats, piece.formats)
        numeric = self._shared.setdefault(piece.numeric, piece.numeric)
        self._chunks.append((len(piece.data), formats, numeric))

    def end_pieces(self) -> None:
        """The table's formats, from every piece's kinds (before :meth:`chunks`)."""
        if not all(self._kinds) or self._columns is None:
            raise Irregular("a run without rows")
        order, formats = self._formats_of([_kind_rows(k) for k in self._kinds])
        if order != self._order:
            raise Irregular("columns changed")
        self._formats = tuple(formats)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "RowSpool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _note(seen: dict[Any, Any], col: tuple, types: set[type]) -> None:
    """Add the kinds a column of a chunk holds to those ``seen`` (as
    :func:`~attnbench.report.export.chunks._note_kinds` does, from the column at hand)."""
    for kind_type in types:
        if kind_type is float:
            floats = col if len(types) == 1 else [v for v in col if type(v) is float]
            for value in _float_kinds(floats):
                seen.setdefault(_kind(value), value)
        elif kind_type not in seen:
            seen[kind_type] = next(v for v in col if type(v) is kind_type)


def _mended_json(data: bytes, mend: list[tuple[int, str, str]]) -> bytes:
    """:func:`_mended` for JSON rows (one a line: JSON text holds no raw newline)."""
    rows = []
    for line in data.decode("utf-8").split(",\n"):
        row = json.loads(line)
        for _, name, how in mend:
            value = row[name]
            if value is not None:
                row[name] = float(value) if how == "float" else int(value)
        rows.append(json.dumps(row, allow_nan=False))
    return ",\n".join(rows).encode("utf-8")


def _mended(data: bytes, mend: list[tuple[int, str, str]]) -> bytes:
    """A chunk's CSV with the number cells of some columns printed in the table's format:
    ``float``, an int cell as the float it is in a float64 column; ``int``, a whole float as
    the int of an Int64 column."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator=LINE_END)
    for row in csv.reader(io.StringIO(data.decode("utf-8"), newline="")):
        for j, _, how in mend:
            cell = row[j]
            if not cell:
                continue
            if how == "float":
                if cell.lstrip("-").isdigit():
                    row[j] = repr(float(int(cell)))
            else:
                row[j] = str(int(float(cell)))
        writer.writerow(row)
    return out.getvalue().encode("utf-8")


def row_spool(run_dirs: Sequence[Path], rows_of: Callable[[Path], Iterator[dict]],
              formats_of: FormatsOf, chunk_rows: int, fmt: str) -> RowSpool:
    """A :class:`RowSpool` of the runs' rows (``rows_of(run_dir)``) in ``fmt`` (csv, json),
    read once."""
    spool = RowSpool(formats_of, chunk_rows, fmt)
    try:
        for run_dir in run_dirs:
            spool.add_run(rows_of(Path(run_dir)))
    except BaseException:
        spool.close()
        raise
    return spool
