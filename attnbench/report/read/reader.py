"""A run's records read once, streamed: the report's frame, built in chunks, and what the pages
read of the records besides it (issue 29: a 10^6-record journal in bounded memory).

What a report keeps per record is one frame row, less the columns no page reads
(:data:`UNREAD`); of the records themselves only small tallies: the environments, each
backend's code, the error-trend points of judged tensors, the parity checks (a few per
multi-rank case), the crashes of the failures the page lists and what the failures share
(:mod:`~attnbench.report.read.commonality`). Two keys per row replace the case dicts that the
comparison and two panels matched on (:func:`key_digest`).
"""

from __future__ import annotations

import ctypes
import hashlib
import operator
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from attnbench.errors import ReportError, RunDirError
from attnbench.report.read.code_changes import BackendCodeTally
from attnbench.report.read.commonality import Commonality
from attnbench.report.read.canonical import canonical_text
from attnbench.report.read.data import (PARITY_COLUMNS, Run, flatten, journal_of, load_manifest,
                                        number)
from attnbench.report.read.environment import EnvironmentTally
from attnbench.report.read.trends import SeriesCollector
from attnbench.results.ledger import last_records
from attnbench.results.records import BAD_VERDICTS, SEVERITY, TENSORS
from attnbench.sweep.case import case_fields

CHUNK_ROWS = 5_000
"""Rows flattened (a dict each) before they become a DataFrame: ~11 KB a row while buffered and
converted (RSS growth measured at 30,000 rows in one chunk), ~1.1 KB once in the frame; 5,000
rows keep the buffer near 55 MB (50,000 cost 0.55 GB)."""

UNREAD = ("timing_mode", "flops_fwd", "flops_bwd", "peak_tflops", "fwd_pct_measured_peak",
          "bwd_pct_measured_peak", "fp8_end_to_end_rel_l2", "crash_exit_code",
          *(f"{t}_{c}" for t in TENSORS for c in ("ratio", "nonfinite")))
"""Columns of :func:`~attnbench.report.read.data.flatten` that no page, panel or comparison reads
(``<t>_nonfinite`` is already in ``<t>_over``); export writes them all from ``flatten``."""

_UNREAD = frozenset(UNREAD)

CATEGORICAL = (*case_fields(of_type=str), "gpu_kind", "features", "attention_kind", "host",
               "device_name", "gpu_family", "env_torch", "env_triton", "env_attnbench", "clock",
               "run_id", "crash_signal", "reason")
"""The case's text fields and the record's text columns of a few distinct values, kept as categories
with sorted categories (a code byte a row, not ~8 B of offset and the text: ~15 B a row each, ~0.25
GB of a 10^6-row frame), so that sorting and grouping read them as the text in order (groupby
observes only the values present: pandas 3's default). ``reason``: one text for most cases (every
pass), numbers in a failure's. Not ``verdict`` (``.map`` then sort), ``label``, ``id``, the keys
(distinct per case, so codes and categories would cost more than the text), nor ``compile_*``
(filled with new text by the compile panel)."""

INT32 = (*case_fields(of_type=int), "world_size", "sequences")
"""The case's integer fields and the two the row derives from them: columns kept as int32 in a chunk
whose values all fit (4 B a row, not 8: ~60 MB of a 10^6-row frame); a chunk with one that does not
(a seed past 2^31, a hostile record's size) stays int64, and so does the column it joins. Sizes are
at most ``sweep.case.MAX_SIZE`` = 2^31 - 1 and ranks at most 64. No page computes with them in the
column's type (a product such as the FLOPs of a case is made from the record, in Python or float64,
before the frame): pages compare, group, sort and print them, which int32 does as int64 does."""
_INT32 = np.iinfo(np.int32)

MATCH_KEY = "match_key"
"""The case without ``gpu`` (:func:`~attnbench.report.read.data.case_key`): how compare and the
architecture panel find one case in two runs or on two GPU kinds."""
PARALLEL_KEY = "parallel_key"
"""The case without ``gpu``, ``cp``, ``tp``, ``cp_algo``: a multi-rank case's world-size-1 twin."""
PARALLEL_IGNORES = ("gpu", "cp", "tp", "cp_algo")
DIGEST_BYTES = 8
"""A key is the blake2b digest of the case's canonical text as a signed int64, not the text
(~0.3 KB a row) nor its hex (32 B a row as text, and pandas hashes text as Python strings
where it matches keys: ~0.2 GB of the architecture panel's peak at 10^6 rows). 64 bits: two
runs of 10^6 cases (2 x 10^12 pairs of keys) hold two different cases under one key with odds
~10^-7."""

MAX_FAILURES_LISTED = 300
"""Failures the page lists with their reason and crash; the rest are counted."""


_SPLIT = PARALLEL_IGNORES[1:]
_NOT_SHARED = frozenset(PARALLEL_IGNORES)


def _shared_digest(case: dict[str, Any]):
    return hashlib.blake2b(canonical_text({k: v for k, v in case.items()
                                           if k not in _NOT_SHARED}), digest_size=DIGEST_BYTES)


def _split_text(case: dict[str, Any]) -> bytes:
    return canonical_text({k: case[k] for k in _SPLIT if k in case})


def case_keys(case: dict[str, Any]) -> tuple[int, int]:
    """``(MATCH_KEY, PARALLEL_KEY)`` of a case. The parallel key is the digest of the case's
    :func:`canonical_text` without ``gpu``, ``cp``, ``tp``, ``cp_algo``; the match key, the
    digest of that text followed by the canonical text of the case's ``cp``, ``tp``,
    ``cp_algo``: the case encoded once, not twice (the two keys: ~28 -> ~15 us a record, 10^6
    records). A text ends where its object's braces close, so no two cases share the two texts
    (the keys are equal where the cases, less what each ignores, are). Keys are made and
    compared within one run of attnbench, never stored."""
    digest = _shared_digest(case)
    parallel = digest.digest()
    digest.update(_split_text(case))
    return _int64(digest.digest()), _int64(parallel)


def key_digest(case: dict[str, Any]) -> int:
    """The ``MATCH_KEY`` of a case (:func:`case_keys`), alone (what a comparison reads)."""
    digest = _shared_digest(case)
    digest.update(_split_text(case))
    return _int64(digest.digest())


def _int64(digest: bytes) -> int:
    return int.from_bytes(digest, "little", signed=True)


class RunReader:
    """Records in, one at a time; :meth:`finish` returns the frame and the tallies.

    ``columns``: keep only these frame columns (compare reads a few dozen); ``tallies``:
    collect what one run's dashboard reads besides the frame (trend points, parity checks,
    crashes), which a comparison does not."""

    def __init__(self, run_id: str = "", columns: Iterable[str] | None = None,
                 tallies: bool = True, start: int = 0, chunk_rows: int | None = None):
        self.run_id = run_id
        self.columns = None if columns is None else list(dict.fromkeys(columns))
        self.tallies = tallies
        self.chunk_rows = chunk_rows or CHUNK_ROWS
        self.start = start  # file-order position of the first record (a range's: not 0)
        self.head: list[dict[str, Any]] = []  # a range's rows of a chunk begun before it
        self.rows: list[dict[str, Any]] = []
        self.parts: dict[str, list[pd.Series | int]] = {}  # column -> chunks (int: n NaN)
        self.environments = EnvironmentTally()
        self.backend_code = BackendCodeTally()
        self.series = SeriesCollector()
        self.parity: list[dict[str, Any]] = []
        self.failures: list[tuple] = []  # (sort key, id, crash) of the first failures listed
        self.commonality = Commonality()
        self.count = start

    def add(self, rec: dict[str, Any]) -> None:
        row = flatten(rec, self.run_id)
        case = rec.get("case") or {}
        if self.tallies:
            row[MATCH_KEY], row[PARALLEL_KEY] = case_keys(case)
        else:
            row[MATCH_KEY] = key_digest(case)
        self.environments.add(rec)
        self.backend_code.add(rec)
        if self.tallies:
            self.series.add(rec)
            self.commonality.add(rec)
            self._parity(rec, row)
            if row["verdict"] in BAD_VERDICTS:
                self._failure(rec, row)
        self._take(row)

    def _take(self, row: dict[str, Any]) -> None:
        """A row into the chunk being buffered; chunks end where those of a read from the
        first record end (every ``chunk_rows`` records), whatever ``start``: one frame from
        ranges read apart, as from one read (types are inferred a chunk at a time)."""
        self.rows.append(row)
        self.count += 1
        if self.count % self.chunk_rows == 0:
            self._flush()

    def merge(self, other: "RunReader") -> None:
        """Join what ``other`` read of the records that follow those read here (a range's
        :class:`RunReader`, its ``start`` this one's ``count``): its rows and chunks after
        these, its tallies merged after these; the result is that of one reader of both."""
        if other.start != self.count:
            raise Misaligned(f"a range starting at record {other.start} after {self.count}")
        for row in other.head:
            self._take(row)
        if other.parts:
            if self.rows:  # its first whole chunk would follow a chunk not yet ended
                raise Misaligned(f"chunks of a range starting at record {other.start}")
            for name, parts in other.parts.items():
                self.parts.setdefault(name, []).extend(parts)
            self.count = other.count - len(other.rows)
        for row in other.rows:
            self._take(row)
        self.environments.merge(other.environments)
        self.backend_code.merge(other.backend_code)
        self.series.merge(other.series)
        self.commonality.merge(other.commonality)
        self.parity.extend(other.parity)
        self.failures.extend(other.failures)  # positions already file-order (``start``)
        self._cut_failures()

    def _parity(self, rec: dict[str, Any], row: dict[str, Any]) -> None:
        for chk in rec.get("checks") or []:
            if isinstance(chk, dict) and chk.get("check") == "parity":
                self.parity.append({**{k: row[k] for k in PARITY_COLUMNS},
                                    "tensor": chk.get("tensor"), "metric": chk.get("metric"),
                                    "value": number(chk.get("value")),
                                    "bound": number(chk.get("bound")),
                                    "passed": chk.get("passed")})

    def _failure(self, rec: dict[str, Any], row: dict[str, Any]) -> None:
        """Keep the crash of the failures the page lists: the first MAX_FAILURES_LISTED in its
        order (severity, backend, features, label; missing values last; then file order)."""
        key = (SEVERITY.index(row["verdict"]) if row["verdict"] in SEVERITY else len(SEVERITY),
               *(_sort_text(row[c]) for c in ("backend", "features", "label")), self._position())
        self.failures.append((key, row["id"], rec.get("crash") or None))
        self._cut_failures()

    def _position(self) -> int:
        """The record's position in the journal (file order): ties in the failures' order."""
        return self.count

    def _cut_failures(self) -> None:
        if len(self.failures) > 2 * MAX_FAILURES_LISTED:  # amortised: sort and cut now and then
            self.failures = sorted(self.failures)[:MAX_FAILURES_LISTED]

    def _flush(self) -> None:
        """The buffered rows as a DataFrame (its types inferred as for one of every row), kept
        as one Series per column: a column of the chunk is a view of a block shared by all its
        columns of one type, so each is copied out and the chunk freed."""
        if self.rows and (self.count - len(self.rows)) % self.chunk_rows:
            # a range's first rows, of a chunk begun in the range before: joined there, as rows
            self.head, self.rows = self.rows, []
            return
        if self.rows:
            chunk = self._narrow(self._chunk(self.rows))
            self.rows = []
            for name in chunk.columns:
                column = chunk[name]
                # a number no record of the chunk has (fp8's split on a bf16 run, compile
                # times on a CPU one): its length, not 8 B a row of NaN, until the frame is built
                missing = column.dtype == np.float64 and not column.notna().any()
                self.parts.setdefault(name, []).append(len(column) if missing else column.copy())

    def _chunk(self, rows: list[dict[str, Any]]) -> pd.DataFrame:
        """The rows as a DataFrame of the columns kept (39 of ~110 for a comparison, all but
        :data:`UNREAD` for a report): typing a column is ~0.1 us a cell, so the others are not
        typed to be dropped. Rows as tuples are typed as rows as dicts are (one path in pandas)."""
        first = rows[0]
        keep = ([c for c in first if c not in _UNREAD] if self.columns is None
                else [c for c in self.columns if c in first])
        if len(keep) < 2:  # (itemgetter of one key gives the value, not a tuple)
            return pd.DataFrame(rows)[keep]
        return pd.DataFrame(list(map(operator.itemgetter(*keep), rows)), columns=keep)

    def _narrow(self, df: pd.DataFrame, categories: bool = True) -> pd.DataFrame:
        if self.columns is not None:
            df = df[[c for c in self.columns if c in df]]
        else:
            df = df.drop(columns=[c for c in UNREAD if c in df])
        for name in CATEGORICAL if categories else ():
            if name in df and _all_text(df[name]):
                df[name] = df[name].astype("category")
        for name in INT32 if categories else ():
            if name in df and _fits_int32(df[name]):
                df[name] = df[name].astype(np.int32)
        return df

    def frame(self) -> pd.DataFrame:
        """The frame of every row added, built a column at a time (each column's parts freed
        once joined: the peak is the frame and one column, not the frame twice). The columns
        that no record has (33 of a simulated run's: accuracy, fp8, compile, bandwidth) are
        views of one array of NaN: 8 B a row once, not per column (~0.25 GB at 10^6 rows)."""
        self._flush()
        if not self.parts:
            empty = flatten({"case": {}}, self.run_id)
            empty.update({MATCH_KEY: "", PARALLEL_KEY: ""} if self.tallies else {MATCH_KEY: ""})
            return self._narrow(pd.DataFrame(columns=list(empty)), categories=False)
        columns = {}
        missing = None  # the NaN of every column no record has: one array, read-only, shared
        for name in list(self.parts):
            if all(isinstance(p, int) for p in self.parts[name]):
                if missing is None:
                    nan = np.full(sum(self.parts[name]), np.nan)
                    nan.flags.writeable = False  # never written in place, whoever holds it
                    missing = pd.Series(nan, copy=False)
                del self.parts[name]
                # a shallow copy: pandas knows the array is shared, so a write copies it
                columns[name] = missing.copy(deep=False)
                continue
            parts = [pd.Series(np.full(p, np.nan)) if isinstance(p, int) else p
                     for p in self.parts.pop(name)]
            if name in CATEGORICAL:
                parts = _joinable(parts)
            column = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
            if len(parts) > 1 and column.dtype == object:
                # all None in one chunk (object), text in another: the type one DataFrame
                # of every row would have had
                column = column.infer_objects()
            columns[name] = column
            del parts
            _release_freed()
        return pd.DataFrame(columns, copy=False)

    def crashes(self) -> dict[str, dict[str, Any]]:
        return {i: crash for _, i, crash in sorted(self.failures)[:MAX_FAILURES_LISTED] if crash}

    def parity_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.parity)


class Misaligned(ValueError):
    """A range's reader that does not follow the records read (a blank line, which pass 1
    does not count, moved the records after it): the run is read by one process instead."""


def read_run(run_dir: str | Path, columns: Iterable[str] | None = None,
             tallies: bool = True) -> Run:
    """The run at ``run_dir``, its journal read once, streamed (each case's last record:
    :func:`~attnbench.results.ledger.last_records`). ``columns`` and ``tallies``: see
    :class:`RunReader` (what a comparison reads)."""
    run_dir = Path(run_dir)
    path = journal_of(run_dir)
    manifest = load_manifest(run_dir)
    reader = RunReader(str(manifest.get("run_id") or run_dir.name), columns, tallies)
    try:
        for rec in last_records(path):  # every record checked there (store.check_record)
            reader.add(rec)
    except RunDirError as exc:
        raise ReportError(str(exc)) from None
    return run_of(reader, run_dir, manifest)


def run_of(reader: Any, path: Path, manifest: dict[str, Any]) -> Run:
    """The :class:`Run` a :class:`RunReader` has read."""
    return Run(path=path, manifest=manifest, frame=reader.frame(),
               environments=reader.environments.result(),
               backend_code=reader.backend_code.result(), series=reader.series.series(),
               parity=reader.parity_frame(), crashes=reader.crashes(),
               commonality=reader.commonality.lines())


def run_of_records(path: Path, manifest: dict[str, Any], records: Iterable[dict[str, Any]],
                   run_id: str = "") -> Run:
    """A run of the records given (tests, previews): what :func:`read_run` builds."""
    reader = RunReader(run_id)
    for rec in records:
        reader.add(rec)
    return run_of(reader, Path(path), manifest)


def _malloc_trim():
    """glibc's ``malloc_trim`` from the process's own symbols (no ``find_library``: on Linux
    it runs ``ldconfig`` in a subprocess); None where there is none (macOS, musl, Windows)."""
    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)
    except (OSError, TypeError):
        return None


_TRIM = _malloc_trim()


def _release_freed() -> None:
    """Give the pages of the chunks just joined back to the system (glibc's ``malloc_trim``,
    as dask's workers do; nothing elsewhere). Their small arrays lie among live objects, so
    free() keeps them: joining a 10^6-row frame held its chunks and the frame at once (RSS
    +146 MiB at 3x10^5 rows with them kept, -12 MiB trimmed after each column)."""
    if _TRIM is not None:
        _TRIM(0)


def _all_text(column: pd.Series) -> bool:
    """Every value text or missing: what a categorical column may hold here (a hostile record's
    number among the text stays as it was)."""
    return pd.api.types.infer_dtype(column, skipna=True) in ("string", "empty")


def _fits_int32(column: pd.Series) -> bool:
    """An int64 column whose every value int32 holds (an empty one too)."""
    return column.dtype == np.int64 and (
        column.empty or (_INT32.min <= column.min() and column.max() <= _INT32.max))


def _joinable(parts: list[pd.Series]) -> list[pd.Series]:
    """A categorical column's chunks as one, its categories the union of theirs, sorted (so
    code order is text order); chunks of which some were not text: as plain values again."""
    if all(isinstance(p.dtype, pd.CategoricalDtype) for p in parts):
        # a chunk where the column is all missing has categories of no type (object), which
        # union_categoricals refuses beside text ones
        kinds = [p.cat.categories.dtype for p in parts if len(p.cat.categories)]
        if kinds:
            parts = [p.cat.set_categories(p.cat.categories.astype(kinds[0])) for p in parts]
        return [pd.Series(union_categoricals(parts, sort_categories=True), name=parts[0].name)]
    return [p.astype(object) if isinstance(p.dtype, pd.CategoricalDtype) else p for p in parts]


def _sort_text(value: Any) -> tuple[int, str]:
    """How pandas sorts a text column: values in order, missing (None, NaN) last."""
    return (0, value) if isinstance(value, str) else (1, "")
