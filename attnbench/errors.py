"""User-facing errors and the exit status of every command, in one place.

Exit status (every ``attnbench`` command):

==== =============================================================================================
0    success
1    a run finished with failing cases (fail, error, crash, timeout, oom, lost), or ran no case
     because its backends refuse them all (every case unsupported), a comparison found a
     regression, or the selftest missed a bug / raised a false alarm
2    bad input: a sweep file, a run directory, a dashboard definition or an argument; or an
     output that cannot be written (a full or read-only disk, ``> /dev/full``): nothing ran
3    the cluster failed (scheduler unreachable or lost, no workers, cases left pending, no case
     ran because no connected worker can run any: every case skipped or unsupported), or the
     disk under a run did (full, read-only, I/O error) while it ran: the journal keeps every
     record written before; rerun the same command to resume
4    no case failed, but the accuracy trends across the sweep found a finding (an error that
     grows with the sequence faster than the baseline's); ``attnbench show`` lists them
130  interrupted (Ctrl-C, SIGTERM); the run resumes where it stopped
141  standard output was closed early (``attnbench show RUN | head``): stopped quietly
==== =============================================================================================

Every error meant for a user is a :class:`UserError`: its message is one line, ready to print
(``FILE: FIELD: got X, expected Y``), and it carries its exit status, so the CLI turns any of them
into that status without a traceback.
"""

from __future__ import annotations

import reprlib
import sys
import unicodedata

EXIT_OK = 0
EXIT_FAILURES = 1
EXIT_BAD_INPUT = 2
EXIT_CLUSTER = 3
EXIT_FINDINGS = 4
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a command whose reader left

EXIT_STATUS_HELP = """exit status:
  0    success
  1    failing cases (fail, error, crash, timeout, oom, lost) or every case unsupported
       (nothing ran), a regression in compare, or a selftest that missed a bug
  2    bad input (sweep file, run directory, dashboard definition, argument), or an output
       that cannot be written (disk full or read-only)
  3    the cluster failed (unreachable, no workers, cases left pending, no worker can run
       any case: nothing ran), or the disk did during a run: resume later
  4    no case failed, but an accuracy finding was made (error growing with the sequence)
  130  interrupted (Ctrl-C, SIGTERM): the journal is valid, rerun to resume
  141  standard output closed early (piped into head): stopped quietly"""


class UserError(Exception):
    """A problem the user can fix; ``str(error)`` is the whole message."""

    exit_status = EXIT_BAD_INPUT


class SweepError(UserError, ValueError):
    """A sweep file (or a case) is malformed."""


class RunDirError(UserError, ValueError):
    """A run directory that cannot be used; the message names the file and what is wrong."""


class ReportError(UserError, ValueError):
    """A run or dashboard definition that cannot be reported."""


class UsageError(UserError, ValueError):
    """A command-line argument that cannot be used (checked before anything is created)."""


class CaptureError(UserError, ValueError):
    """A capture file (:mod:`attnbench.capture`) that cannot be read or written: one line,
    ``capture FILE: what (expected ...)``."""


class ClusterError(UserError, RuntimeError):
    """The cluster cannot be used (unreachable, no workers, scheduler lost)."""

    exit_status = EXIT_CLUSTER


class DiskError(UserError):
    """The disk under a run failed while it ran (ENOSPC, EROFS, EIO): one line naming the file
    and the error. Exit 3, not 2: nothing is wrong with the input, the journal keeps what was
    written before, and the same command resumes once the disk can take more."""

    exit_status = EXIT_CLUSTER


def os_error_text(exc: OSError, what: str = "") -> str:
    """``FILE: No space left on device (ENOSPC)`` -- an OSError as the one line a user reads;
    ``what`` names the file when the error does not (a write to an open file)."""
    import errno

    where = exc.filename if exc.filename is not None else what
    name = errno.errorcode.get(exc.errno or 0)
    text = f"{exc.strerror or exc}" + (f" ({name})" if name else "")
    if exc.errno in (errno.EMFILE, errno.ENFILE):  # not the disk: read as one, it misled
        where = exc.filename  # (issue 41, item 2: connections held on the driver's lane port)
        text += (": the process is out of file descriptors, not disk space (files and "
                 "connections count alike: `ulimit -n`, or connections held open to it)")
    return printable(f"{where}: {text}" if where else text, 2000)


class BackendError(RuntimeError):
    """A rank's report of an exception a backend raised in its own code
    (:mod:`attnbench.execution.blame`): the case is that backend's ``error`` and ``str()`` is
    the record's reason, with the backend's frame; any other exception that escapes a rank is a
    harness error. Raised in rank processes, read by name where their outcome becomes a record
    (:func:`attnbench.cluster.task.outcome_to_record`), so it imports nothing."""


CONTRACT_BREACH = "backend contract: "
"""How the reason of a :class:`ContractBreach` starts (the selftest reads it)."""


class ContractBreach(BackendError):
    """What a backend returned is not what the case asks for (a dtype, a shape:
    :mod:`attnbench.accuracy.contract`): the backend's ``error``, ``str()`` its one-line
    reason, ``backend contract: ...``."""

    def __init__(self, what: str):
        super().__init__(CONTRACT_BREACH + what)


def exception_summary(exc: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message`` -- how an exception reads in a record's reason."""
    text = str(exc).strip()
    first = text.splitlines()[0][:limit] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


# -- what a message may show of the user's input -----------------------------------------------

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple = 2, 5, 5, 5
_REPR.maxset = _REPR.maxfrozenset = _REPR.maxdeque = _REPR.maxarray = 5
_REPR.maxstring, _REPR.maxlong, _REPR.maxother = 80, 40, 80
MESSAGE_LIMIT = 400
"""Characters of one message that come from input (a file's value, a record's reason)."""


def short_repr(value: object) -> str:
    """``repr(value)`` bounded in size and in work: a YAML alias bomb or a 10^26-digit number
    reads ``[[[...], ...], ...]`` / ``1000...0000``, in microseconds (reprlib looks at no more
    than 5 items on 2 levels)."""
    return printable(_REPR.repr(value), MESSAGE_LIMIT)


def shown_key(key: object) -> str:
    """A mapping key as the FIELD part of a message: itself when it is a short printable
    string, else its bounded repr."""
    if isinstance(key, str) and len(key) <= 60 and key.isprintable():
        return key
    return short_repr(key)[:60]


_BIDI = {"\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068",
         "\u2069", "\u200e", "\u200f"}


def printable(text: object, limit: int | None = None) -> str:
    """``text`` safe to print on one terminal line: control characters (ESC, CR, newline, C1),
    and bidirectional overrides become visible escapes (``\\x1b``), so a record's reason or a
    backend's name cannot move the cursor, recolour the terminal or reorder what is shown.
    Longer than ``limit``: cut, with ``...``."""
    text = str(text)
    if limit is not None and len(text) > limit:
        text = text[:limit] + "..."
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() and c not in _BIDI else _escape(c) for c in text)


def _escape(c: str) -> str:
    if c == " " or unicodedata.category(c) == "Zs":
        return " "
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def quiet_broken_pipe() -> int:
    """After standard output's reader left (``attnbench show RUN | head``): point stdout at
    /dev/null so the interpreter's last flush cannot raise again, and stop without a traceback."""
    import os
    import sys

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return EXIT_BROKEN_PIPE


# -- which exceptions are out of memory (the rank process, the case runners and the judge ask) --

# Messages that mark an exception as running out of memory. torch raises torch.OutOfMemoryError
# for CUDA but a plain RuntimeError from its CPU allocator ("DefaultCPUAllocator: can't allocate
# memory", checked with torch 2.13); older or wrapped errors only keep the text.
_OOM_TEXT = ("out of memory", "can't allocate memory")


def is_oom(exc: BaseException) -> bool:
    """True for MemoryError, torch.OutOfMemoryError and allocator failures, also when they are
    the cause or context of the exception that escaped."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, MemoryError):
            return True
        torch = sys.modules.get("torch")
        oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
        if oom_type is not None and isinstance(exc, oom_type):
            return True
        if isinstance(exc, RuntimeError) and any(t in str(exc).lower() for t in _OOM_TEXT):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False
