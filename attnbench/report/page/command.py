"""``attnbench report``: argparse wiring and :func:`write_report`, which draws one run.

``attnbench run`` calls :func:`write_report` at the end of a run. Bad input (a RUN without
records.jsonl, a malformed dashboard) is a :class:`ReportError`: one line naming the file and
field, exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnbench.errors import EXIT_BAD_INPUT, EXIT_OK, ReportError, printable
from attnbench.report.page.dashboard import Dashboard, default_dashboard, load_dashboard
from attnbench.report.read.jobs import add_jobs_option, jobs_of
from attnbench.report.read.pool import read_run_jobs
from attnbench.results.files import refusal

REPORT_DIR = "dashboard"
"""Where ``attnbench report RUN`` draws by default: ``RUN/dashboard/``, beside the records, so a
run directory copied anywhere carries its dashboard -- never into whatever project the current
directory happens to be in."""
CHECKOUT_DASHBOARDS = Path(__file__).resolve().parents[3] / "dashboards"
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
    reading the journal (:func:`~attnbench.report.read.pool.read_run_jobs`). Raises
    :class:`ReportError` on bad input.
    """
    from attnbench.report.page.build import build_report  # matplotlib only when drawing

    spec = resolve_dashboard(Path(dashboard) if dashboard else None)
    run = read_run_jobs(Path(run_dir), jobs)
    out = Path(out_dir) if out_dir else Path(run_dir) / REPORT_DIR
    try:
        return build_report(run, spec, out)
    except OSError as exc:  # a full disk, a read-only run, a link where a file goes
        raise ReportError(f"{exc.filename or out}: cannot write the dashboard: "
                          f"{refusal(exc)}") from None


def add_report_command(subparsers: argparse._SubParsersAction) -> None:
    """``attnbench report RUN``."""
    p = subparsers.add_parser(
        "report", help="draw the dashboard of a run (RUN/dashboard/index.html)",
        description="Draw a run's dashboard: figures (PNG and SVG) and a self-contained "
                    "index.html. Prints the path of index.html.")
    p.add_argument("run", type=Path, metavar="RUN", help="run directory (results/<run-id>)")
    p.add_argument("--dashboard", type=Path, default=None, metavar="YAML",
                   help="dashboard definition (default: dashboards/default.yaml)")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help=f"output directory (default: RUN/{REPORT_DIR}/, beside the records)")
    add_jobs_option(p)
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    try:
        index = write_report(args.run, args.dashboard, args.out, jobs_of(args))
    except ReportError as exc:
        print(f"attnbench report: {printable(exc, 2000)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(printable(index))
    return EXIT_OK
