"""The order of a history's runs, and which order it is.

By the commit's date when every run knows it (``software.commit_date``, recorded since issue
40; runs of one commit by when they began), else by when each run began
(``manifest.created``) when every run knows that, else as given. The order used is said (text,
page, JSON), since a history by start time of runs that tested old commits late reads wrong.
"""

from __future__ import annotations

from typing import Sequence

from attnbench.report.history.collect import HistoryRun

ORDERS = ("commit date", "run start", "as given")
"""The orders, best first: what :func:`order_runs` says it used."""


def order_runs(runs: Sequence[HistoryRun]) -> tuple[list[HistoryRun], str]:
    """``runs`` in history order (stable: equal keys keep the order given) and the order's
    name (:data:`ORDERS`)."""
    if runs and all(r.commit_date is not None for r in runs):
        starts = all(r.created is not None for r in runs)
        return sorted(runs, key=lambda r: (r.commit_date, r.created if starts else 0)), ORDERS[0]
    if runs and all(r.created is not None for r in runs):
        return sorted(runs, key=lambda r: r.created), ORDERS[1]
    return list(runs), ORDERS[2]
