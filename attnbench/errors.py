"""User-facing errors and the exit status of every command, in one place.

Exit status (every ``attnbench`` command):

==== =============================================================================================
0    success
1    a run finished with failing cases (fail, error, crash, timeout, oom, lost), a comparison
     found a regression, or the selftest missed a bug / raised a false alarm
2    bad input: a sweep file, a run directory, a dashboard definition or an argument
3    the cluster failed (scheduler unreachable or lost, no workers, cases left pending): resume
4    no case failed, but the accuracy trends across the sweep found a finding (an error that
     grows with the sequence faster than the baseline's); ``attnbench show`` lists them
130  interrupted (Ctrl-C, SIGTERM); the run resumes where it stopped
==== =============================================================================================

Every error meant for a user is a :class:`UserError`: its message is one line, ready to print
(``FILE: FIELD: got X, expected Y``), and it carries its exit status, so the CLI turns any of them
into that status without a traceback.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURES = 1
EXIT_BAD_INPUT = 2
EXIT_CLUSTER = 3
EXIT_FINDINGS = 4
EXIT_INTERRUPTED = 130


class UserError(Exception):
    """A problem the user can fix; ``str(error)`` is the whole message."""

    exit_status = EXIT_BAD_INPUT


class SweepError(UserError, ValueError):
    """A sweep file (or a case) is malformed."""


class RunDirError(UserError, ValueError):
    """A run directory that cannot be used; the message names the file and what is wrong."""


class ReportError(UserError, ValueError):
    """A run or dashboard definition that cannot be reported."""


class ClusterError(UserError, RuntimeError):
    """The cluster cannot be used (unreachable, no workers, scheduler lost)."""

    exit_status = EXIT_CLUSTER


def exception_summary(exc: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message`` -- how an exception reads in a record's reason."""
    text = str(exc).strip()
    first = text.splitlines()[0][:limit] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
