"""``attnbench report``, ``compare`` and ``history`` put on the CLI's subparsers, in one call.

The commands live in their rooms: ``report`` in :mod:`attnbench.report.page.command`,
``compare`` in :mod:`attnbench.report.compare.command`, ``history`` in
:mod:`attnbench.report.history.command` (``export`` in
:mod:`attnbench.report.export.command`). :func:`write_report` and :func:`run_compare` are
importable from here too, as they were before the move (issue 38).
"""

from __future__ import annotations

import argparse
from typing import Sequence

from attnbench.report.compare.command import add_compare_command, run_compare
from attnbench.report.history.command import add_history_command
from attnbench.report.page.command import add_report_command, write_report

__all__ = ["add_report_commands", "main", "run_compare", "write_report"]


def add_report_commands(subparsers: argparse._SubParsersAction) -> None:
    """``report``, ``compare``, ``history``, in the order ``attnbench --help`` lists them."""
    add_report_command(subparsers)
    add_compare_command(subparsers)
    add_history_command(subparsers)


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry (``python -m attnbench.report.commands``)."""
    parser = argparse.ArgumentParser(prog="attnbench")
    add_report_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
