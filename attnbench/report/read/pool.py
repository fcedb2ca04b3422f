"""``attnbench report --jobs N`` and ``compare --jobs N``: a run's journal read by N local
processes; the :class:`~attnbench.report.read.data.Run` of ``--jobs 1``, the same to the byte.

Reading is ~85 % of a report at 10^6 records (issue 29: parse and check each line, flatten
it, two case keys, the tallies), all of it per record. The first pass over the journal reads
ids only (~1 us a line) and stays here: it cuts the journal into ranges of :data:`TASK_LINES`
lines (:func:`~attnbench.results.ledger.line_ranges`). A worker reads a range's records as the
serial reader would (:func:`~attnbench.results.ledger.range_records`, every line checked) into
a :class:`~attnbench.report.read.reader.RunReader` that starts at the range's first record's
position in the journal, so that its chunks end where the serial read's end (every
``CHUNK_ROWS`` records: each chunk's types are inferred from its rows) and its failures sort
by their position in the journal; the rows of a chunk that straddles two ranges come back as
rows. Here the readers are merged in journal order (:meth:`RunReader.merge`): rows, chunks
and tallies after those before, then the frame is built as the serial read builds it. A
worker's bad line is raised when its range's turn comes: the first in journal order, as the
serial path raises it. A range whose records do not start where pass 1 counted (a blank line
before it: pass 1 counts lines) is :class:`~attnbench.report.read.reader.Misaligned`: the run is
read again by one process.

Only spawned processes (no fork: the parent may hold threads); what comes back is our own
children's pickled readers (pandas Series, dicts, numbers), never data from the network.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Iterator

from attnbench.errors import ReportError, RunDirError
from attnbench.report.read.data import Run, journal_of, load_manifest
from attnbench.report.read.jobs import results_in_order, worth_a_pool
from attnbench.report.read.reader import Misaligned, RunReader, read_run, run_of
from attnbench.results.ledger import LineRange, line_ranges, range_records

TASK_LINES = 10_000
"""Lines a worker reads at once: two chunks of ``CHUNK_ROWS`` (5,000), so that a journal
without retried cases cuts into ranges of whole chunks (no rows to join here); ~2.5 s of
work at ~250 us a record, against ~50 ms here to unpickle and join a range's chunks (~11 MB
of frame)."""
WINDOW = 2
"""Ranges in flight per worker: one read, one queued, so no worker waits for the main
process; memory here is at most ``WINDOW * jobs`` ranges' readers (~11 MB each) beyond the
frame, whatever the journal's length."""


def read_run_jobs(run_dir: str | Path, jobs: int = 1, columns: Iterable[str] | None = None,
                  tallies: bool = True) -> Run:
    """:func:`~attnbench.report.read.reader.read_run`, read by ``jobs`` processes where the
    journal is long enough to pay for starting them (``export``'s rule:
    :func:`~attnbench.report.read.jobs.worth_a_pool`); ``jobs`` 1: read here alone."""
    if jobs > 1 and worth_a_pool([Path(run_dir)]):
        run = pool_read(run_dir, jobs, columns, tallies)
        if run is not None:
            return run
    return read_run(run_dir, columns, tallies)


def pool_read(run_dir: str | Path, jobs: int, columns: Iterable[str] | None = None,
              tallies: bool = True, task_lines: int | None = None) -> Run | None:
    """The run read by ``jobs`` workers, ``task_lines`` lines a task (:data:`TASK_LINES`);
    None where it must be read by one process (no semaphores here, a range
    :class:`Misaligned`). Refused as :func:`read_run` refuses: the journal and manifest first,
    then pass 1's bad lines, then the first bad line of pass 2."""
    run_dir = Path(run_dir)
    path = journal_of(run_dir)
    manifest = load_manifest(run_dir)
    reader = RunReader(str(manifest.get("run_id") or run_dir.name), columns, tallies)
    try:
        pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))
        pool.submit(_ready)  # the workers start (~1 s: Python, pandas) during pass 1
    except (NotImplementedError, OSError):  # no working semaphores here: one process reads
        return None
    try:
        try:
            parts = line_ranges(path, task_lines or TASK_LINES)
        except RunDirError as exc:
            raise ReportError(str(exc)) from None
        for other in _readers(pool, jobs, path, reader, parts):
            reader.merge(other)
    except Misaligned:
        return None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return run_of(reader, run_dir, manifest)


def _starts(parts: list[LineRange]) -> list[int]:
    """Each range's first record's position in the journal as pass 1 counts it: a line a
    record, but a retried case's later lines (yielded at its first). Blank lines, which
    pass 1 does not tell apart, make it wrong: :class:`Misaligned` when merged."""
    starts, position = [], 0
    for part in parts:
        starts.append(position)
        position += part.count - len(part.repeats)
    return starts


def _readers(pool: ProcessPoolExecutor, jobs: int, path: Path, reader: RunReader,
             parts: list[LineRange]) -> Iterator[RunReader]:
    """The ranges' readers in journal order, at most ``WINDOW * jobs`` in flight."""
    todo = iter(zip(parts, _starts(parts)))

    def submit() -> Future | None:
        task = next(todo, None)
        if task is None:
            return None
        part, start = task
        return pool.submit(_read_range, str(path), reader.run_id, part, start, reader.columns,
                           reader.tallies, reader.chunk_rows)

    for _, value in results_in_order(submit, WINDOW * jobs, path, jobs):
        yield value


def _ready() -> None:
    """A worker's first task: nothing, once this module (and pandas) is imported to run it."""


def _read_range(path: str, run_id: str, part: LineRange, start: int,
                columns: list[str] | None, tallies: bool, chunk_rows: int
                ) -> tuple[str, Any]:
    """A worker's task: ``("read", RunReader)`` of a range's records, its first at
    ``start``; ``("error", message)`` for a bad line (the serial path's message)."""
    reader = RunReader(run_id, columns, tallies, start=start, chunk_rows=chunk_rows)
    try:
        for rec in range_records(Path(path), part):  # every record checked there
            reader.add(rec)
    except RunDirError as exc:
        return "error", str(exc)
    return "read", reader
