"""``--jobs N``, the processes that read runs (``export``, ``report``, ``compare``): parsed,
defaulted and ordered here, in one place, for the three commands.

:func:`parse_jobs` reads the option, :func:`default_jobs` picks it when not given,
:func:`worth_a_pool` says whether a journal is long enough to pay for workers, and
:func:`results_in_order` takes the workers' results back in journal order (``export --jobs``:
:mod:`attnbench.report.export.pool`; ``report``/``compare --jobs``:
:mod:`attnbench.report.read.pool`).
"""

from __future__ import annotations

import argparse
import os
from collections import deque
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from attnbench.errors import ReportError

JOBS_LIMIT = 64
"""The most ``--jobs`` accepts: each worker is a Python with pandas (~0.15 GB, ~1 s to
start) and past ~8 the main process, which joins what they read alone, is the bottleneck
(:data:`MAX_JOBS`); 64 is more cores than our hosts have, and
``--jobs 800`` (a typo) would start 800 processes."""


def parse_jobs(text: str) -> int:
    """``--jobs``: a whole number, 1 to :data:`JOBS_LIMIT`."""
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if not 1 <= jobs <= JOBS_LIMIT:
        raise argparse.ArgumentTypeError(f"got {text!r}, expected a whole number of "
                                         f"processes, 1 to {JOBS_LIMIT}")
    return jobs


def add_jobs_option(p: argparse.ArgumentParser) -> None:
    """``--jobs N`` / ``-j N`` on ``report`` and ``compare``."""
    p.add_argument("--jobs", "-j", type=parse_jobs, default=None, metavar="N",
                   help="processes reading each journal (default: the CPUs this process may "
                        "use, at most 8; 1: this process alone; journals under 16 MiB are "
                        "read by one)")


def jobs_of(args: argparse.Namespace) -> int:
    """The ``--jobs`` given, else :func:`default_jobs`."""
    return default_jobs() if args.jobs is None else args.jobs


MAX_JOBS = 8
"""Default ``--jobs`` at most: each worker holds a range's rows (~20 MB at 2,000 lines) and
the main process mends and writes every piece alone (~20 % of a row's time), so past ~5
workers it is the bottleneck anyway."""
MIN_POOL_BYTES = 16 << 20
"""Journals smaller than this are read by ``--jobs 1``: spawning a worker (a Python with
pandas) costs ~1 s, the rows of 16 MiB of journal (~15k lines of ~1.1 KB) ~2 s on one core."""


def default_jobs() -> int:
    """The CPUs this process may use, at most :data:`MAX_JOBS`."""
    return max(1, min(MAX_JOBS, len(os.sched_getaffinity(0))))


def worth_a_pool(run_dirs: Sequence[Path]) -> bool:
    """Whether the runs' journals are long enough to pay for starting workers."""
    size = 0
    for run_dir in run_dirs:
        try:
            size += (Path(run_dir) / "records.jsonl").stat().st_size
        except OSError:
            pass  # the serial path names what is missing
    return size >= MIN_POOL_BYTES


def results_in_order(submit: Callable[[], Future | None], in_flight: int, path: Path,
                     jobs: int) -> Iterator[tuple[str, Any]]:
    """Each task's ``(what, value)`` in the order the tasks were submitted (journal order),
    at most ``in_flight`` at once; ``submit()`` sends the next task, None when there is none.
    A dead worker and a task's ``("error", message)`` (a bad line: the serial path's message)
    raise :class:`ReportError`. The order of ``export --jobs`` and ``report``/``compare
    --jobs`` (:mod:`attnbench.report.read.pool`)."""
    pending: deque[Future] = deque()

    def more() -> None:
        future = submit()
        if future is not None:
            pending.append(future)

    for _ in range(in_flight):
        more()
    while pending:
        try:
            what, value = _next_done(pending).result()
        except BrokenProcessPool:
            raise ReportError(f"{path}: a worker of --jobs {jobs} died (killed, or out of "
                              "memory); try --jobs 1") from None
        more()
        if what == "error":
            raise ReportError(value)
        yield what, value


def _next_done(pending: deque[Future]) -> Future:
    """The next result in journal order (the oldest task)."""
    return pending.popleft()
