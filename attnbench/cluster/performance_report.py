"""Dask's performance report of a run, saved beside its records.

``results/<run>/dask-performance.html`` is the static page ``distributed.performance_report``
writes (task stream, worker profiles, bandwidth, scheduler profile): what the live Dask
dashboard showed, kept for after the cluster is gone. One per ``attnbench run`` invocation; a
resumed run overwrites it with its own pass. A report that cannot be made (an old scheduler,
bokeh missing) costs the run nothing: a warning line, and the records stand.

Cost: Dask's scheduler builds the page (profiles, bokeh figures) when the run ends: 1.2 s for
the smoke sweep on 2 busy cores (measured around ``attnbench run sweeps/smoke.yaml``; the
figures are Dask's, there is no cheaper mode of the same report).
"""

from __future__ import annotations

import contextlib
import html
import logging
import time
from pathlib import Path
from typing import Iterator

log = logging.getLogger("attnbench")

REPORT_NAME = "dask-performance.html"


@contextlib.contextmanager
def saved_performance_report(run_dir: Path, client, command: str) -> Iterator[None]:
    """Record the Dask performance report of what runs inside, into ``run_dir``; ``command``
    is what the report shows as its code."""
    from distributed import performance_report

    path = Path(run_dir) / REPORT_NAME
    report = performance_report(filename=str(path))
    try:
        client.sync(report.__aenter__)
    except Exception as exc:  # no report is no reason to lose a run
        log.warning("no Dask performance report: %s: %s", type(exc).__name__, exc)
        yield
        return
    # An exception inside (the scheduler lost, an error) skips the report: asking a scheduler
    # that is gone would only wait. An interrupted run returns normally and gets its report.
    yield
    started = time.perf_counter()
    try:
        # Dask puts `code` into its page as it is: a sweep path like "<script>.yaml" stays text.
        client.sync(report.__aexit__, None, None, None, code=html.escape(command))
        log.debug("Dask performance report written in %.2f s", time.perf_counter() - started)
    except Exception as exc:
        log.warning("no Dask performance report: %s: %s", type(exc).__name__, exc)
