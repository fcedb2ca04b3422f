"""``--jobs N``, the processes that read runs (``export``, ``report``, ``compare``): parsed
here, in one place, for the three commands."""

from __future__ import annotations

import argparse

JOBS_LIMIT = 64
"""The most ``--jobs`` accepts: each worker is a Python with pandas (~0.15 GB, ~1 s to
start) and past ~8 the main process, which joins what they read alone, is the bottleneck
(:data:`~attnbench.report.export_pool.MAX_JOBS`); 64 is more cores than our hosts have, and
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
