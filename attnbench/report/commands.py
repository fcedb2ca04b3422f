"""``attnbench report`` and ``attnbench compare``: argparse wiring and the functions behind them.

The CLI (``attnbench/cli.py``) calls :func:`add_report_commands` on its subparsers; ``attnbench
run`` calls :func:`write_report` at the end of a run. Bad input (a RUN without records.jsonl, a
malformed dashboard) is a :class:`ReportError`: one line naming the file and field, exit 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Sequence, TextIO

from attnbench.report.compare import FAIL_ON, compare_runs, load_compared, summary_text
from attnbench.report.compare_formats import FORMATS, comparison_markdown, write_comparison_json
from attnbench.report.dashboard import Dashboard, default_dashboard, load_dashboard
from attnbench.errors import EXIT_BAD_INPUT, EXIT_FAILURES, EXIT_OK, ReportError, printable
from attnbench.report.export_pool import default_jobs
from attnbench.report.jobs import parse_jobs
from attnbench.report.read_pool import read_run_jobs
from attnbench.results.files import refusal

log = logging.getLogger("attnbench.report")



REPORT_DIR = "dashboard"
"""Where ``attnbench report RUN`` draws by default: ``RUN/dashboard/``, beside the records, so a
run directory copied anywhere carries its dashboard -- never into whatever project the current
directory happens to be in."""
CHECKOUT_DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
"""The dashboard definitions of attnbench's own checkout (absent in an installed wheel)."""


def resolve_dashboard(dashboard: Path | None, name: str = "default") -> Dashboard:
    """The named file, else ``dashboards/<name>.yaml`` of attnbench's checkout, else the
    built-in one (what an installed attnbench has)."""
    if dashboard is not None:
        return load_dashboard(dashboard)
    candidate = CHECKOUT_DASHBOARDS / f"{name}.yaml"
    if candidate.is_file():
        return load_dashboard(candidate)
    return default_dashboard()


def write_report(run_dir: Path, dashboard: Path | None = None, out_dir: Path | None = None,
                 jobs: int = 1) -> Path:
    """Draw the dashboard for one run; returns the path of its ``index.html``.

    ``out_dir`` defaults to ``<run_dir>/dashboard/`` (:data:`REPORT_DIR`); ``jobs``: processes
    reading the journal (:func:`~attnbench.report.read_pool.read_run_jobs`). Raises
    :class:`ReportError` on bad input.
    """
    from attnbench.report.page import build_report  # matplotlib only when drawing

    spec = resolve_dashboard(Path(dashboard) if dashboard else None)
    run = read_run_jobs(Path(run_dir), jobs)
    out = Path(out_dir) if out_dir else Path(run_dir) / REPORT_DIR
    try:
        return build_report(run, spec, out)
    except OSError as exc:  # a full disk, a read-only run, a link where a file goes
        raise ReportError(f"{exc.filename or out}: cannot write the dashboard: "
                          f"{refusal(exc)}") from None


def run_compare(run_dirs: Sequence[Path], *, threshold: float = 0.05, out_dir: Path | None = None,
                dashboard: bool = True, stream: TextIO | None = None, fmt: str = "text",
                fail_on: str = "both", jobs: int = 1) -> int:
    """Compare each run with the first (the baseline): write the comparison dashboard (unless
    ``dashboard`` is false; ``out_dir`` defaults to ``compare-<A>-vs-<B>/`` inside the last
    run's directory) and print the summary to ``stream`` as ``fmt`` (text, json, markdown:
    :mod:`attnbench.report.compare_formats`); ``jobs``: processes reading each journal, one
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
        from attnbench.report.compare_page import build_compare  # matplotlib only when drawing

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


def add_report_commands(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report", help="draw the dashboard of a run (RUN/dashboard/index.html)",
        description="Draw a run's dashboard: figures (PNG and SVG) and a self-contained "
                    "index.html. Prints the path of index.html.")
    p.add_argument("run", type=Path, metavar="RUN", help="run directory (results/<run-id>)")
    p.add_argument("--dashboard", type=Path, default=None, metavar="YAML",
                   help="dashboard definition (default: dashboards/default.yaml)")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help=f"output directory (default: RUN/{REPORT_DIR}/, beside the records)")
    _add_jobs(p)
    p.set_defaults(func=cmd_report)

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
    _add_jobs(c)
    c.set_defaults(func=cmd_compare)


def _add_jobs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", "-j", type=parse_jobs, default=None, metavar="N",
                   help="processes reading each journal (default: the CPUs this process may "
                        "use, at most 8; 1: this process alone; journals under 16 MiB are "
                        "read by one)")


def _jobs_of(args: argparse.Namespace) -> int:
    return default_jobs() if args.jobs is None else args.jobs


def cmd_report(args: argparse.Namespace) -> int:
    try:
        index = write_report(args.run, args.dashboard, args.out, _jobs_of(args))
    except ReportError as exc:
        print(f"attnbench report: {printable(exc, 2000)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(printable(index))
    return EXIT_OK


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
                           fmt=args.format, fail_on=args.fail_on, jobs=_jobs_of(args))
    except ReportError as exc:
        print(f"attnbench compare: {printable(exc, 2000)}", file=sys.stderr)
        return EXIT_BAD_INPUT


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry (``python -m attnbench.report.commands``) until cli.py wires these."""
    parser = argparse.ArgumentParser(prog="attnbench")
    add_report_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
