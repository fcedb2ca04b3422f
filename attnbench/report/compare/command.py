"""``attnbench compare``: argparse wiring and :func:`run_compare`, which sets runs side by side.

Bad input (a RUN without records.jsonl, runs that share no case) is a :class:`ReportError`:
one line naming the file and field, exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence, TextIO

from attnbench.errors import EXIT_BAD_INPUT, EXIT_FAILURES, EXIT_OK, ReportError, printable
from attnbench.report.compare.comparison import FAIL_ON, compare_runs, load_compared, summary_text
from attnbench.report.compare.formats import FORMATS, comparison_markdown, write_comparison_json
from attnbench.report.read.jobs import add_jobs_option, jobs_of
from attnbench.results.files import refusal


def run_compare(run_dirs: Sequence[Path], *, threshold: float = 0.05, out_dir: Path | None = None,
                dashboard: bool = True, stream: TextIO | None = None, fmt: str = "text",
                fail_on: str = "both", jobs: int = 1) -> int:
    """Compare each run with the first (the baseline): write the comparison dashboard (unless
    ``dashboard`` is false; ``out_dir`` defaults to ``compare-<A>-vs-<B>/`` inside the last
    run's directory) and print the summary to ``stream`` as ``fmt`` (text, json, markdown:
    :mod:`attnbench.report.compare.formats`); ``jobs``: processes reading each journal, one
    run after the other. Returns the exit status: ``EXIT_FAILURES`` when
    a regression the gate ``fail_on`` counts (speed, accuracy or both) happened on the same GPU
    kind, else ``EXIT_OK``. Raises :class:`ReportError` on bad input.
    """
    paths = [Path(d).resolve() for d in run_dirs]
    if len(set(paths)) < len(paths):
        dup = next(p for p in paths if paths.count(p) > 1)
        raise ReportError(f"RUN: {dup} is given twice")
    runs = [load_compared(Path(d), jobs) for d in run_dirs]
    ids = [r.run_id for r in runs]
    for run in runs:
        if ids.count(run.run_id) > 1:  # copies of one run directory: tell them apart by path
            run.manifest = {**run.manifest, "run_id": f"{run.run_id} ({run.path})"}
    ids = [r.run_id for r in runs]
    comps = [compare_runs(runs[0], other, threshold) for other in runs[1:]]
    for comp in comps:  # a gate that compared nothing must not pass
        if comp.pairs.empty:
            raise ReportError(f"RUN: {comp.b.path} ({len(comp.only_b)} cases) shares no case with "
                              f"the baseline {comp.a.path} ({len(comp.only_a)} cases): nothing "
                              "to compare (runs of different sweeps?)")
    index = None
    if dashboard:
        from attnbench.report.compare.page import build_compare  # matplotlib only when drawing

        name = "compare-" + "-vs-".join(_safe_name(i) for i in ids)
        out = Path(out_dir) if out_dir else _writable_default(Path(run_dirs[-1]), name[:200])
        try:
            index = build_compare(comps, out, command=["attnbench", "compare",
                                                       *map(str, run_dirs),
                                                       "--threshold", str(threshold)])
        except OSError as exc:  # a full disk, a read-only --out, a link where a file goes
            raise ReportError(f"{exc.filename or out}: cannot write the comparison: "
                              f"{refusal(exc)}") from None
    stream = stream or sys.stdout
    if fmt == "json":
        write_comparison_json(comps, fail_on, index, stream)
    elif fmt == "markdown":
        stream.write(comparison_markdown(comps, fail_on, index))
    else:
        stream.write("\n".join(printable(line) for line in
                                summary_text(comps, index, fail_on).split("\n")) + "\n")
    return EXIT_FAILURES if any(len(c.regressions_on(fail_on)) for c in comps) else EXIT_OK


def _writable_default(last_run: Path, name: str) -> Path:
    """``compare``'s default dashboard folder: inside the last run, or -- when that run is
    read-only (a teammate's results, an archive) -- in the working directory, said in one
    line on stderr."""
    inside = last_run / name
    if inside.exists() or os.access(last_run, os.W_OK | os.X_OK):
        return inside
    here = Path.cwd() / name
    print(f"attnbench: note: {last_run} is read-only; the comparison dashboard goes to {here} "
          "(--out DIR chooses)", file=sys.stderr)
    return here


def _safe_name(run_id: str) -> str:
    """A directory name from a run id (which comes from a manifest: any text), at most 100
    ASCII characters."""
    name = "".join(c if (c.isascii() and c.isalnum()) or c in "-_.+" else "_"
                   for c in run_id[:100]).strip(".")
    return name or "run"


def add_compare_command(subparsers: argparse._SubParsersAction) -> None:
    """``attnbench compare RUN RUN...``."""
    c = subparsers.add_parser(
        "compare", help="compare runs (GPU kinds, versions): faster, slower, same, ambiguous",
        description="Match the same cases (ignoring the gpu field) in runs and compare each run "
                    "with the first: timing as FAST / SLOW / SAME / AMBIGUOUS on the same exact "
                    "GPU kind (ratios only across kinds; AMBIGUOUS where a timing is noisy), "
                    "accuracy as verdict changes and error ratios between judged cases (a case "
                    "timed with accuracy: false is not judged). Warns when the runs differ in "
                    "driver, CUDA, cuDNN, NCCL, torch, triton, clocks, power limit or commit. "
                    "Writes a comparison dashboard and prints a summary. Exit status 1 when a "
                    "case got slower, went from pass to a failing verdict, or stopped running "
                    "to the end, on the same GPU kind, so it can gate CI (--fail-on accuracy: "
                    "on verdicts alone).")
    c.add_argument("runs", type=Path, nargs="+", metavar="RUN",
                   help="run directories; the first is the baseline")
    c.add_argument("--threshold", type=float, default=0.05,
                   help="relative gap the robust intervals must clear to count (default 0.05)")
    c.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="output directory (default: compare-<A>-vs-<B>/ inside the last RUN)")
    c.add_argument("--no-dashboard", action="store_true", help="print the summary only")
    c.add_argument("--format", choices=FORMATS, default="text",
                   help="summary as text (default), json (every matched case, for tools) or "
                        "markdown (for a pull-request comment)")
    c.add_argument("--fail-on", choices=FAIL_ON, default="both",
                   help="what makes the exit status 1: speed (a case SLOW on the same GPU "
                        "kind), accuracy (a case from a good verdict to a failing one), or "
                        "both (default)")
    add_jobs_option(c)
    c.set_defaults(func=cmd_compare)



def cmd_compare(args: argparse.Namespace) -> int:
    if len(args.runs) < 2:
        print("attnbench compare: RUN: give at least two run directories (the first is the "
              "baseline)", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not 0 <= args.threshold < 1:  # NaN fails too
        print(f"attnbench compare: --threshold: got {args.threshold}, expected a number in "
              "[0, 1) such as 0.05", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return run_compare(args.runs, threshold=args.threshold, out_dir=args.out,
                           dashboard=not args.no_dashboard, stream=sys.stdout,
                           fmt=args.format, fail_on=args.fail_on, jobs=jobs_of(args))
    except ReportError as exc:
        print(f"attnbench compare: {printable(exc, 2000)}", file=sys.stderr)
        return EXIT_BAD_INPUT
