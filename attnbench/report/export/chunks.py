"""``attnbench export`` of 10^6 cases: the table in chunks, each typed as the whole would be.

pandas types a column from every value in it (ints and a None: float64, printed ``139.0``;
None alone: object; strings: str), so a chunk of rows alone may type a column otherwise than
the whole table does, and its CSV, JSON or Parquet would differ. So the runs are read once
(:func:`spool`: each record checked, flattened by :func:`~attnbench.report.read.data.flatten` and
let go): the rows go to a temporary file, and each column keeps one value of each kind it holds
(type, and for a float NaN, whole or not: what pandas' typing and
:func:`~attnbench.report.export.command._counts_as_integers` look at). Then
:meth:`Spool.frames` gives the chunks back as frames, each built with those values in front --
every kind of every run, so typed as the whole table -- and the values cut off again. Memory:
a chunk of rows and the kinds, whatever the runs' size; disk: the rows, pickled, for a moment.
"""

from __future__ import annotations

import math
import operator
import pickle
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import pandas as pd

CHUNK_ROWS = 10_000
"""Rows per chunk: a flattened row is a dict of ~110 values, ~6 KB in memory, so ~60 MB a
chunk, ~10x that while pandas builds and formats it."""


class Spool:
    """The rows of some runs on disk, in chunks, and each run's values of every kind."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile()  # gone when closed, also when killed
        self._chunks: list[tuple[int, int]] = []
        """(run index, rows) of each chunk written, in order."""
        self._kinds: list[dict[str, dict[Any, Any]]] = []
        """Per run: column -> kind -> its first value of that kind."""
        self.rows = 0

    def add_run(self, rows: Iterator[dict[str, Any]]) -> None:
        kinds: dict[str, dict[Any, Any]] = {}
        run = len(self._kinds)
        self._kinds.append(kinds)
        chunk: list[dict[str, Any]] = []
        for row in rows:
            chunk.append(row)
            if len(chunk) >= CHUNK_ROWS:
                self._write(run, chunk)
                chunk = []
        if chunk:
            self._write(run, chunk)

    def _write(self, run: int, rows: list[dict[str, Any]]) -> None:
        columns = _note_kinds(self._kinds[run], rows)
        if columns is not None and len(columns) > 1:  # (itemgetter of one key: not a tuple)
            # rows of one shape (flatten's): values only, the columns once (a third less to
            # pickle and load, and a frame made from tuples in half the time of dicts)
            values = list(map(operator.itemgetter(*columns), rows))
            pickle.dump((columns, values), self._file, protocol=pickle.HIGHEST_PROTOCOL)
        else:
            pickle.dump((None, rows), self._file, protocol=pickle.HIGHEST_PROTOCOL)
        self._chunks.append((run, len(rows)))
        self.rows += len(rows)

    def frames(self, make_frame: Callable[..., pd.DataFrame]
               ) -> Iterator[tuple[pd.DataFrame, int]]:
        """Each chunk as ``(frame, front)``: the frame holds first ``front`` rows of every run's
        kinds, then the chunk's rows, so that what is done to it types it as the whole table
        would be; cut the first ``front`` rows off when writing. ``make_frame(rows, run)``
        types one run's rows (as the whole run would be when ``rows`` hold its kinds);
        ``make_frame(values, run, columns)`` the same rows as tuples of their values in the
        order of ``columns`` (pandas makes both the same frame). No rows at all: one empty
        frame, with the columns."""
        kinds = [make_frame(_kind_rows(k), run) for run, k in enumerate(self._kinds)]
        front = sum(len(f) for f in kinds)
        if not self._chunks:
            yield (pd.concat(kinds, ignore_index=True) if len(kinds) > 1 else kinds[0]), front
            return
        self._file.seek(0)
        for run, count in self._chunks:
            columns, rows = pickle.load(self._file)
            kind_rows = _kind_rows(self._kinds[run])
            if columns is not None and columns == tuple(self._kinds[run]):
                # the frame make_frame would make of the dicts: columns in the order they
                # first come (the kinds' rows come first), values as they are
                made = make_frame(list(map(operator.itemgetter(*columns), kind_rows)) + rows,
                                  run, columns)
            else:
                if columns is not None:  # the run's kinds gained columns from another chunk
                    rows = [dict(zip(columns, values)) for values in rows]
                made = make_frame(kind_rows + rows, run)
            own = made.iloc[len(kinds[run]):]
            yield pd.concat(kinds + [own], ignore_index=True), front

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "Spool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _note_kinds(kinds: dict[str, dict[Any, Any]], rows: list[dict[str, Any]]
                ) -> tuple[str, ...] | None:
    """Add the kinds the rows' columns hold (:func:`_kind`), column by column: a set of types
    per column is C-speed, a value at a time is ~50 us a row (as much as flattening it).
    Returns the rows' columns where all have the same (in the first row's order), else None."""
    columns = dict.fromkeys(c for row in rows[:1] for c in row)
    shaped = all(row.keys() == columns.keys() for row in rows)  # flatten's rows: one shape
    if not shaped:
        columns = dict.fromkeys(c for row in rows for c in row)
    for column in columns:
        values = list(map(operator.itemgetter(column), rows)) if shaped else \
            [row.get(column) for row in rows]
        seen = kinds.setdefault(column, {})
        types = set(map(type, values))
        for kind_type in types:
            if kind_type is float:
                floats = values if len(types) == 1 else [v for v in values if type(v) is float]
                for value in _float_kinds(floats):
                    seen.setdefault(_kind(value), value)
            elif kind_type not in seen:
                seen[kind_type] = next(v for v in values if type(v) is kind_type)
    return tuple(columns) if shaped else None


def _float_kinds(floats: list[float]) -> list[float]:
    """One float of each kind among ``floats`` (NaN, whole, fraction)."""
    out = []
    finite = floats
    if any(map(math.isnan, floats)):
        out.append(math.nan)
        finite = [v for v in floats if v == v]
    wholes = set(map(float.is_integer, finite))
    if True in wholes:
        out.append(next(v for v in finite if v.is_integer()))
    if False in wholes:
        out.append(next(v for v in finite if not v.is_integer()))
    return out


def _kind(value: Any) -> Any:
    """What pandas' typing of a column depends on: the type, and for a float whether it is NaN
    (missing) and whether it is whole (a count column is an integer one only if all are)."""
    if type(value) is float:
        return "nan" if value != value else "whole" if value.is_integer() else "fraction"
    return type(value)


def _kind_rows(kinds: dict[str, dict[Any, Any]]) -> list[dict[str, Any]]:
    """Rows that hold, in each column, one value of each kind it holds (a column with fewer
    kinds repeats its first: a kind repeated adds none)."""
    depth = max((len(k) for k in kinds.values()), default=0)
    columns = {c: list(k.values()) for c, k in kinds.items()}
    return [{c: values[min(i, len(values) - 1)] for c, values in columns.items()}
            for i in range(depth)]


def spool_runs(run_dirs: Sequence[Path], rows_of: Callable[[Path], Iterator[dict]]) -> Spool:
    """A :class:`Spool` of the runs' rows (``rows_of(run_dir)``), read once."""
    spool = Spool()
    try:
        for run_dir in run_dirs:
            spool.add_run(rows_of(Path(run_dir)))
    except BaseException:
        spool.close()
        raise
    return spool
