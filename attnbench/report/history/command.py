"""``attnbench history RUN...``: argparse wiring and :func:`run_history`.

Bad input (a RUN that is no run directory nor a folder of them, a hostile journal or manifest,
an --out that is not attnbench's) is a :class:`ReportError`: one line, exit 2. A history
informs; it never fails a build (``attnbench compare`` gates one run against another): exit 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence, TextIO

from attnbench.errors import EXIT_BAD_INPUT, EXIT_OK, ReportError, printable
from attnbench.report.history.collect import load_history
from attnbench.report.history.order import order_runs
from attnbench.report.history.series import build_histories
from attnbench.report.history.table import history_json, history_text
from attnbench.report.read.jobs import add_jobs_option, jobs_of
from attnbench.results.files import refusal

HISTORY_FORMATS = ("text", "json")


def run_history(paths: Sequence[Path], *, threshold: float = 0.05, error_threshold: float = 0.25,
                out_dir: Path | None = None, fmt: str = "text", every_case: bool = False,
                stream: TextIO | None = None, jobs: int = 1) -> int:
    """Read the runs ``paths`` name, order them, find each case's steps per GPU kind, print
    them to ``stream`` as ``fmt`` and, with ``out_dir``, write the page there. Returns
    ``EXIT_OK``; raises :class:`ReportError` on bad input."""
    runs, order = order_runs(load_history(paths, jobs))
    histories = build_histories(runs, threshold, error_threshold)
    stream = stream or sys.stdout
    index = None
    if out_dir is not None:
        from attnbench.report.history.page import build_history_page

        try:
            index = build_history_page(histories, runs, order, Path(out_dir),
                                       ["attnbench", "history", *map(str, paths)])
        except OSError as exc:  # a full disk, a read-only --out, a link where a file goes
            raise ReportError(f"{exc.filename or out_dir}: cannot write the history: "
                              f"{refusal(exc)}") from None
    if fmt == "json":
        history_json(histories, runs, order, stream, None if index is None else str(index))
    else:
        stream.write(history_text(histories, runs, order, every_case))
        if index is not None:
            stream.write(printable(f"page: {index}") + "\n")
    return EXIT_OK


def add_history_command(subparsers: argparse._SubParsersAction) -> None:
    """``attnbench history RUN...``."""
    c = subparsers.add_parser(
        "history", help="each case's time and error over many runs, with the steps in them",
        description="Follow every case over runs of one sweep (per commit, per GPU): its "
                    "forward and backward times and its worst error, per exact GPU kind, runs "
                    "in commit-date order (else by when they began), and the steps: a new "
                    "level that held for at least two runs, larger than the threshold and "
                    "than the noise of the runs around it. Each step names the run it "
                    "appeared in and whether the backend's code changed there. Prints a "
                    "table; --out DIR writes a page; --format json for tools. Exit 0.")
    c.add_argument("runs", type=Path, nargs="+", metavar="RUN",
                   help="run directories, or folders holding them (searched one level deep)")
    c.add_argument("--threshold", type=float, default=0.05,
                   help="relative change of a time that can be a step (default 0.05)")
    c.add_argument("--error-threshold", type=float, default=0.25,
                   help="relative change of the error that can be a step (default 0.25)")
    c.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="write the history page (index.html) into DIR")
    c.add_argument("--format", choices=HISTORY_FORMATS, default="text",
                   help="text (default: steps and a table) or json (every case, every run)")
    c.add_argument("--all", action="store_true", dest="every_case",
                   help="text: list every case, not only those with a step")
    add_jobs_option(c)
    c.set_defaults(func=cmd_history)


def cmd_history(args: argparse.Namespace) -> int:
    for name, value in (("--threshold", args.threshold),
                        ("--error-threshold", args.error_threshold)):
        if not 0 <= value < 10:  # NaN fails too
            print(f"attnbench history: {name}: got {value}, expected a number in [0, 10) "
                  "such as 0.05", file=sys.stderr)
            return EXIT_BAD_INPUT
    try:
        return run_history(args.runs, threshold=args.threshold,
                           error_threshold=args.error_threshold, out_dir=args.out,
                           fmt=args.format, every_case=args.every_case, stream=sys.stdout,
                           jobs=jobs_of(args))
    except ReportError as exc:
        print(f"attnbench history: {printable(exc, 2000)}", file=sys.stderr)
        return EXIT_BAD_INPUT
