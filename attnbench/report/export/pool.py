"""``attnbench export --jobs N`` (csv, json): the rows read, flattened and printed by N local
processes; the table put together here, the bytes of ``--jobs 1``.

One core spends ~120 us a row at 10^6 (issue 29's profile: parse and check ~40 %, flatten
~38 %, printing ~20 %); the first pass over the journal reads ids only (~1 us a line) and stays
here: it cuts the journal into ranges of :data:`TASK_LINES` lines
(:func:`~attnbench.results.ledger.line_ranges`, noting where each retried case is yielded).
A worker yields a range's records as the serial reader would
(:func:`~attnbench.results.ledger.range_records`, every line checked), flattens them and prints
them as one chunk typed by its rows and the kinds of the pieces taken before it was sent
(:meth:`~attnbench.report.export.rows.RowSpool.piece`), and sends back bytes and a few values
of each kind a column holds. Here the pieces are taken in journal order, the table's formats
found from all their kinds, and each piece mended to them as the serial path mends a chunk
typed by the rows before it (the kinds a chunk was typed by are a part of the table's either
way). A worker's bad line is raised when its piece's turn
comes: the first in journal order, as the serial path raises it. What the mending does not
cover (:class:`~attnbench.report.export.rows.Irregular`) goes to the serial path.

Only spawned processes (no fork: the parent may hold threads), only plain data back.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from attnbench.errors import ReportError, RunDirError
from attnbench.report.export.chunks import _kind
from attnbench.report.export.rows import FormatsOf, Irregular, Piece, RowSpool
from attnbench.report.read.jobs import results_in_order
from attnbench.results.ledger import LineRange, line_ranges, range_records

TASK_LINES = 2000
"""Lines a worker reads at once: ~0.25 s of work at ~120 us a row, against ~5 ms per task
here (a piece's bytes through a pipe, its kinds merged); ~2 MB of bytes back."""
WINDOW = 2
"""Tasks in flight per worker: one running, one queued, so no worker waits for the main
process; memory here is at most ``WINDOW * jobs`` pieces, whatever the journal's length."""


def pool_chunks(run_dirs: Sequence[Path], fmt: str, jobs: int, formats_of: FormatsOf,
                task_lines: int | None = None) -> Iterator[bytes] | None:
    """The runs' table in ``fmt`` (csv, json) read by ``jobs`` workers, ``task_lines`` lines
    a task (:data:`TASK_LINES`): the bytes of :func:`~attnbench.report.export.command.from_rows`, or
    None where the pieces are :class:`Irregular` (decided before the first byte)."""
    task_lines = task_lines or TASK_LINES
    try:
        pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))
    except (NotImplementedError, OSError):  # no working semaphores here: one process reads
        return None
    spool = RowSpool(formats_of, task_lines, fmt)
    try:
        for run_dir in run_dirs:
            spool.new_run()
            for piece in _pieces(pool, jobs, Path(run_dir), fmt, task_lines, formats_of,
                                 spool.known_kinds):
                spool.add_piece(piece)
        spool.end_pieces()
        written = spool.chunks()
    except Irregular:
        spool.close()
        return None
    except BaseException:
        spool.close()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)

    def chunks() -> Iterator[bytes]:
        with spool:
            yield from written
    return chunks()


def _pieces(pool: ProcessPoolExecutor, jobs: int, run_dir: Path, fmt: str, task_lines: int,
            formats_of: FormatsOf, known: Callable[[], dict]) -> Iterator[Piece]:
    """One run's pieces in journal order, refused as the serial reader refuses (export's
    ``_rows``): the journal's first pass and first record before the manifest. Each task
    is sent the kinds of the pieces taken so far (``known()``): it types its rows with them,
    as the serial path types a chunk with the rows before it, so that few pieces need mending
    here (a column holding a None in one piece of ten would have the other nine mended)."""
    from attnbench.report.read.data import journal_of, load_manifest

    path = journal_of(run_dir)
    try:
        parts = line_ranges(path, task_lines)
        if parts:
            first = range_records(path, parts[0])
            next(first, None)
            first.close()
    except RunDirError as exc:
        raise ReportError(str(exc)) from None
    manifest = load_manifest(run_dir)
    run_id = str(manifest.get("run_id") or run_dir.name)
    todo = iter(parts)

    def submit() -> Future | None:
        part = next(todo, None)
        return None if part is None else pool.submit(_piece, str(path), run_id, fmt, part,
                                                     formats_of, known())

    for what, value in results_in_order(submit, WINDOW * jobs, path, jobs):
        if what == "irregular":
            raise Irregular(value)
        if what == "piece":
            yield value


def _piece(path: str, run_id: str, fmt: str, part: LineRange, formats_of: FormatsOf,
           known: dict[str, dict[Any, Any]]) -> tuple[str, Any]:
    """A worker's task: ``("piece", Piece)`` of a range's rows, ``("empty", None)`` where it
    yields none (a retried case's later lines), ``("error", message)`` for a bad line (the
    serial path's message), ``("irregular", why)``."""
    from attnbench.report.read.data import flatten

    try:
        rows = [flatten(record, run_id) for record in range_records(Path(path), part)]
    except RunDirError as exc:
        return "error", str(exc)
    if not rows:
        return "empty", None
    spool = RowSpool(_Remembered(formats_of), len(rows), fmt)
    try:
        spool.add_run(iter(rows), known)
        return "piece", spool.piece()
    except Irregular as exc:
        return "irregular", str(exc)
    finally:
        spool.close()


_SEEN_FORMATS: dict[tuple, tuple[list[str], list[str]]] = {}
"""In a worker: the formats of kinds already typed. A table's columns hold a handful of kind
sets, and typing one (pandas frames) costs ~10 ms, a range's whole budget ~250 ms."""


class _Remembered:
    """``formats_of``, typing each set of kinds once per worker (:data:`_SEEN_FORMATS`)."""

    def __init__(self, formats_of: FormatsOf):
        self._formats_of = formats_of

    def __call__(self, kind_rows: list[list[dict[str, Any]]]) -> tuple[list[str], list[str]]:
        key = tuple(tuple(tuple((name, _kind(value)) for name, value in row.items())
                          for row in rows) for rows in kind_rows)
        if key not in _SEEN_FORMATS:
            _SEEN_FORMATS[key] = self._formats_of(kind_rows)
        order, formats = _SEEN_FORMATS[key]
        return list(order), list(formats)
