"""``attnbench export``: a run's records as one flat table, in the formats other tools read.

One row per case, the columns of :func:`attnbench.report.read.data.frame` (case fields, verdict and
reason, the exact GPU kind and software, forward/backward timing -- median, quartiles, min,
samples, TFLOP/s, % of peak, GB/s, noisy -- and per tensor out/dq/dk/dv the relative L2 error,
its bound, the baseline ratio and NaN/Inf count), so pandas, DuckDB, a spreadsheet or ``jq``
need no knowledge of the record schema::

    attnbench export results/RUN --format csv > cases.csv
    attnbench export results/RUN --format parquet --out cases.parquet
    attnbench export results/A results/B --format json | jq '.[] | select(.verdict != "pass")'

Several runs concatenate (``run_id`` tells them apart). Values that are not scalars (a sliding
window mask ``{"window": 64}``) are JSON text in CSV and Parquet, themselves in JSON; a packed
case's lengths (``seqlens_q``) are a list of integers in JSON and Parquet, JSON text in CSV.
Counts (samples ``fwd_n``, ``out_nonfinite``, calls per sample) are integers in every format,
not floats. Missing numbers are empty in CSV and null in JSON and Parquet. Imports neither
torch nor matplotlib.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator, Sequence

import pandas as pd

import attnbench.report.export.chunks as chunking
from attnbench.errors import EXIT_OK, ReportError, UsageError
from attnbench.report.export.chunks import spool_runs
from attnbench.report.export.pool import pool_chunks
from attnbench.report.export.rows import Irregular, printable_cells, row_spool
from attnbench.report.export.rows import scalar as _scalar
from attnbench.report.read.jobs import default_jobs, parse_jobs, worth_a_pool
from attnbench.results.files import refusal, write_atomic

FORMATS = ("csv", "parquet", "json")
FIRST_COLUMNS = ("run_id", "id", "label", "backend", "verdict", "reason")
COUNT_SUFFIXES = ("_n", "_nonfinite", "_calls_per_sample", "_warmup_calls")
"""Columns that count things: integers, though a missing value made pandas hold them as floats
(``fwd_n`` exported as 6.0, issue 27)."""
LENGTH_COLUMNS = ("seqlens_q", "seqlens_kv")
"""A packed case's lengths: lists of integers where the format has lists (JSON, Parquet)."""


def export_frame(run_dirs: Sequence[Path]) -> pd.DataFrame:
    """The runs' records as one frame, one row per case, first the columns people look for
    (the whole table in memory: :func:`export_runs` writes it in chunks instead)."""
    frames = []
    with spool_runs(run_dirs, _rows) as spool:
        for frame, front in spool.frames(_run_frame):
            frames.append(_ordered(frame).iloc[front:])
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else \
        frames[0].reset_index(drop=True)


def _rows(run_dir: Path) -> Iterator[dict[str, Any]]:
    """A run's rows (:func:`~attnbench.report.read.data.flatten`), its records streamed: refused
    as :func:`~attnbench.report.read.data.load_run` refuses a run, before any row."""
    from attnbench.errors import RunDirError
    from attnbench.report.read.data import flatten, journal_of, load_manifest
    from attnbench.results.store import stream_records

    journal_of(run_dir)
    records = stream_records(run_dir)
    try:
        first = next(records, None)  # the journal's first pass: a bad line refuses here
    except RunDirError as exc:
        raise ReportError(str(exc)) from None
    manifest = load_manifest(run_dir)
    run_id = str(manifest.get("run_id") or run_dir.name)
    if first is None:
        return
    yield flatten(first, run_id)
    try:
        for record in records:
            yield flatten(record, run_id)
    except RunDirError as exc:
        raise ReportError(str(exc)) from None


def _run_frame(rows: list, run: int, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """One run's rows as :func:`~attnbench.report.read.data.frame` makes them (no rows: the
    columns alone); with ``columns``, rows are tuples of their values in that order (the same
    frame: pandas types a column of either from its values alike)."""
    from attnbench.report.read.data import flatten

    if not rows:
        return pd.DataFrame(columns=list(flatten({"case": {}})))
    if columns is not None:
        return pd.DataFrame(rows, columns=list(columns))
    return pd.DataFrame(rows)


def _ordered(df: pd.DataFrame) -> pd.DataFrame:
    """First the columns people look for; counts as integers."""
    order = [c for c in FIRST_COLUMNS if c in df] + [c for c in df if c not in FIRST_COLUMNS]
    return _counts_as_integers(df[order])


def _counts_as_integers(df: pd.DataFrame) -> pd.DataFrame:
    """Count columns as nullable integers (``Int64``), where every value present is whole."""
    df = df.copy()
    for col in df.columns:
        if not col.endswith(COUNT_SUFFIXES) or not pd.api.types.is_numeric_dtype(df[col]) \
                or pd.api.types.is_bool_dtype(df[col]):
            continue
        present = df[col].dropna()
        if ((present % 1) == 0).all():
            df[col] = df[col].astype("Int64")
    return df


def _parquet_scalar(value: Any) -> Any:
    """A cell as Parquet holds it: a list of integers (a pack's lengths) stays a list."""
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        return list(value)
    return _scalar(value)


def _plain(value: Any) -> Any:
    """A cell as strict JSON can hold it: NaN, infinities and pandas' NA become null, numpy
    scalars Python ones."""
    if value is pd.NA:
        return None
    if hasattr(value, "item") and not isinstance(value, (dict, list, str)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _cells(df: pd.DataFrame, fn) -> pd.DataFrame:
    """``fn`` of every cell that may hold a dict or a list: those of the object columns. A
    typed column (numbers, flags, pandas' str) holds neither and ``fn`` leaves its cells as
    they are; mapping them all was ~110 Python calls a row, a third of export's time at 10^5."""
    out = df.copy()
    for col in df.columns[(df.dtypes == object).to_numpy()]:
        out[col] = df[col].map(fn)
    return out


def csv_chunks(frames: Iterator[tuple[pd.DataFrame, int]]) -> Iterator[bytes]:
    """The table as CSV, a chunk at a time (the header with the first); control characters
    of its text escaped (:func:`~attnbench.report.export.rows.printable_cells`)."""
    for i, (df, front) in enumerate(frames):
        yield _printable(_cells(df, _scalar)).iloc[front:].to_csv(
            index=False, header=i == 0, lineterminator="\n").encode("utf-8")


def _printable(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its text columns' cells as :func:`printable_cells` writes them."""
    for col in df.columns:
        if df[col].dtype == object or pd.api.types.is_string_dtype(df[col].dtype):
            values = list(df[col])
            cells = printable_cells(values)
            if cells is not values:
                df[col] = pd.Series(cells, index=df.index, dtype=object)
    return df


def json_chunks(frames: Iterator[tuple[pd.DataFrame, int]]) -> Iterator[bytes]:
    """A JSON array of row objects, one row per line (valid JSON that ``head`` still shows)."""
    yield b"[\n"
    first = True
    for df, front in frames:
        rows = [json.dumps({k: _plain(v) for k, v in row.items()}, allow_nan=False)
                for row in df.iloc[front:].to_dict(orient="records")]
        if rows:
            yield (("" if first else ",\n") + ",\n".join(rows)).encode("utf-8")
            first = False
    yield b"\n]\n"


def parquet_chunks(frames: Iterator[tuple[pd.DataFrame, int]]) -> Iterator[bytes]:
    """The table as Parquet, a row group per chunk, its schema that of the first (every chunk
    is typed as the whole table: :mod:`~attnbench.report.export.chunks`); written as pandas'
    ``to_parquet`` writes (pyarrow, snappy), so a table of one chunk is the same file."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise UsageError("--format parquet: needs the package pyarrow, which is not installed "
                         "here (pip install pyarrow, or attnbench[parquet])") from None
    sink = io.BytesIO()
    writer = None
    try:
        for df, front in frames:
            cells = _cells(df.drop(columns=[c for c in LENGTH_COLUMNS if c in df]), _scalar)
            for col in LENGTH_COLUMNS:  # list<int64> columns, null for dense cases
                if col in df:
                    cells.insert(list(df.columns).index(col), col,
                                 df[col].map(_parquet_scalar))
            table = pa.Table.from_pandas(cells, preserve_index=False).slice(front)
            if writer is None:
                writer = pq.ParquetWriter(sink, table.schema, compression="snappy")
            writer.write_table(table.cast(writer.schema))
            yield _drain(sink)
    finally:
        if writer is not None:
            writer.close()
    yield _drain(sink)


def _drain(sink: io.BytesIO) -> bytes:
    """What the Parquet writer wrote since the last call (its buffer emptied)."""
    data = sink.getvalue()
    sink.seek(0)
    sink.truncate()
    return data


WRITERS = {"csv": csv_chunks, "json": json_chunks, "parquet": parquet_chunks}


def _formats(kind_rows: list[list[dict[str, Any]]]) -> tuple[list[str], list[str]]:
    """The columns of the runs' table and how CSV prints each (``F`` float64, ``I`` Int64,
    ``N`` any other: :mod:`~attnbench.report.export.rows`), from rows that hold every kind
    of value each run's columns hold (:mod:`~attnbench.report.export.chunks`)."""
    frames = [_run_frame(rows, run) for run, rows in enumerate(kind_rows)]
    df = _ordered(pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0])
    return list(df.columns), ["F" if t == "float64" else "I" if isinstance(t, pd.Int64Dtype)
                              else "N" for t in df.dtypes]


def export_chunks(run_dirs: Sequence[Path], fmt: str, jobs: int = 1) -> Iterator[bytes]:
    """The runs' table in ``fmt``, in chunks of bytes; the runs are read (and every record
    checked) before the first. CSV and JSON are written from the rows (:mod:`~attnbench.
    report.export_rows`: the frames' bytes), by ``jobs`` processes where the journals are
    long enough (:mod:`~attnbench.report.export.pool`: the same bytes), the frames writing
    what that does not cover. Parquet is written by this process alone."""
    if fmt in ("csv", "json"):
        chunks = None
        if jobs > 1 and worth_a_pool(run_dirs):
            chunks = pool_chunks(run_dirs, fmt, jobs, _formats)
        if chunks is None:
            chunks = from_rows(run_dirs, fmt)
        if chunks is not None:
            yield from chunks
            return
    yield from frames_chunks(run_dirs, fmt)


def from_rows(run_dirs: Sequence[Path], fmt: str, rows_of=None) -> Iterator[bytes] | None:
    """CSV or JSON from the rows (``rows_of(run_dir)``: :func:`_rows`), or None where they
    are :class:`Irregular` (decided before the first byte)."""
    try:
        spool = row_spool(run_dirs, rows_of or _rows, _formats, chunking.CHUNK_ROWS, fmt)
    except Irregular:
        return None
    try:
        written = spool.chunks()
    except Irregular:
        spool.close()
        return None

    def chunks() -> Iterator[bytes]:
        with spool:
            yield from written
    return chunks()


def frames_chunks(run_dirs: Sequence[Path], fmt: str, rows_of=None) -> Iterator[bytes]:
    """The runs' table in ``fmt`` written from frames, each typed as the whole table
    (:mod:`~attnbench.report.export.chunks`); ``rows_of`` as :func:`from_rows`'."""
    with spool_runs(run_dirs, rows_of or _rows) as spool:
        yield from WRITERS[fmt](
            (_ordered(frame), front) for frame, front in spool.frames(_run_frame))


def export_runs(run_dirs: Sequence[Path], fmt: str, out: Path | None,
                force: bool = False, jobs: int = 1) -> int:
    """Write the table to ``out`` (a file; ``-`` or None: standard output). Parquet, being
    binary, goes to a terminal only through a redirect. An existing ``out`` is replaced only
    with ``force`` (then atomically: a reader sees the old table or the new one); a run given
    twice is refused (its rows would be doubled)."""
    if fmt == "parquet" and out in (None, Path("-")) and sys.stdout.isatty():
        raise UsageError("--format parquet: binary output to a terminal; give --out FILE "
                         "or redirect standard output to a file")
    if out not in (None, Path("-")) and Path(out).is_dir():
        raise UsageError(f"--out: {out} is a directory; expected a file name such as "
                         f"cases.{fmt}")
    if out not in (None, Path("-")) and not force and os.path.lexists(out):
        raise UsageError(f"--out: {out} exists; give --force to replace it, or another name")
    paths = [Path(d).resolve() for d in run_dirs]
    for i, path in enumerate(paths):
        if path in paths[:i]:
            raise UsageError(f"RUN: {run_dirs[i]} is given twice (its rows would be doubled)")
    chunks = export_chunks(run_dirs, fmt, jobs) if jobs != 1 else export_chunks(run_dirs, fmt)
    if out in (None, Path("-")):
        sys.stdout.flush()
        for data in chunks:
            sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    else:
        size = 0

        def write(fh) -> None:
            nonlocal size
            for data in chunks:
                fh.write(data)
                size += len(data)

        try:  # a temporary file beside it, then a rename: never through a planted link
            write_atomic(out, write, replace=force)
        except FileExistsError:
            raise UsageError(f"--out: {out} exists; give --force to replace it, or another "
                             "name") from None
        except OSError as exc:
            raise ReportError(f"{out}: cannot write: {refusal(exc)}") from None
        print(f"attnbench: {size} bytes of {fmt} in {out}", file=sys.stderr)
    return EXIT_OK


def add_export_command(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "export", help="a run's cases as one table: csv, parquet or json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill("One row per case: the case's fields, verdict and reason, GPU kind and "
                    "software, forward and backward timing (median, quartiles, min, samples, "
                    "TFLOP/s, % of peak, GB/s, noisy) and per tensor (out, dq, dk, dv) the "
                    "relative L2 error, its bound and the baseline ratio. Several runs "
                    "concatenate; run_id tells them apart.", 79),
        epilog="examples:\n"
               "  attnbench export results/RUN --format csv > cases.csv\n"
               "  attnbench export results/RUN --format parquet --out cases.parquet\n"
               "  attnbench export results/A results/B --format json | jq '.[0]'")
    p.add_argument("runs", type=Path, nargs="+", metavar="RUN", help="run directories")
    p.add_argument("--format", choices=FORMATS, default="csv", help="output format (default csv)")
    p.add_argument("--out", "-o", type=Path, default=None, metavar="FILE",
                   help="output file (default: standard output); an existing one is "
                        "refused without --force")
    p.add_argument("--force", action="store_true",
                   help="replace an existing --out file")
    p.add_argument("--jobs", "-j", type=parse_jobs, default=None, metavar="N",
                   help="processes reading the runs for csv and json (default: the CPUs "
                        "this process may use, at most 8; 1: this process alone; parquet "
                        "is always read by one)")
    p.set_defaults(func=lambda args: export_runs(
        args.runs, args.format, args.out, args.force,
        default_jobs() if args.jobs is None else args.jobs))
