"""The parent's side of one rank process: its pipes, its log, whether it is alive, and what a
call came to (:class:`Outcome`). Used by :mod:`attnbench.execution.pool`; imports no torch.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from attnbench.execution.child import HEADER

OUTCOME_KINDS = ("ok", "crash", "timeout", "oom", "error")

TAIL_LINES = 40
"""Lines of a rank's log kept in an outcome."""
_TAIL_BYTES = 64 * 1024
"""Read at most this much of the end of a log to find those lines."""
_LOG_TRUNCATE_BYTES = 1 << 20
"""A warm rank's log is emptied before a call once it is larger than this."""
_REFUSED_MODULES = ("torch", "triton")
"""Modules the parent will not import to unpickle a result (it must never import torch)."""


@dataclass(kw_only=True, slots=True)
class Outcome:
    """What one :meth:`RankPool.run` call came to."""

    kind: str
    """One of ``ok``, ``crash``, ``timeout``, ``oom``, ``error``."""
    result: Any = None
    """Rank 0's return value when ``kind == "ok"``."""
    signal: Optional[str] = None
    """For a crash by signal: its name, e.g. ``"SIGSEGV"``."""
    exit_code: Optional[int] = None
    """For a crash: the Popen-style return code (``-11`` for SIGSEGV, ``3`` for exit(3))."""
    rank: Optional[int] = None
    """The rank the outcome is about (the first to fail; for a timeout, the first still busy)."""
    stderr_tail: str = ""
    """Last lines that rank wrote to stdout/stderr during the call (faulthandler stacks for
    crashes and timeouts land here)."""
    traceback: str = ""
    """For ``error`` and ``oom``: the Python traceback of the exception that escaped."""
    summary: str = ""
    """One line: ``"RuntimeError: deliberate failure"``, ``"killed by SIGSEGV"``, ..."""
    note: str = ""
    """Anything a reader needs to interpret the outcome (e.g. SIGKILL may be the OOM killer)."""
    wall_s: float = 0.0
    """Seconds inside :meth:`RankPool.run`, starting ranks included."""
    start_s: float = 0.0
    """Part of ``wall_s`` spent starting rank processes (0 when the pool was warm)."""
    duration_s: Optional[float] = None
    """Seconds rank 0 spent inside the function, when it answered."""
    pids: tuple[int, ...] = ()
    """Process ids of the ranks that handled the call."""
    recycle: str = ""
    """Why a rank asked to be replaced after answering (:func:`child.recycle_after_call`); the
    pool has then already stopped the ranks."""

    @property
    def ok(self) -> bool:
        return self.kind == "ok"

    def crash_info(self) -> Optional[dict[str, Any]]:
        """The record's ``crash`` field (see :mod:`attnbench.results.records`), None when ``ok``."""
        if self.kind == "ok":
            return None
        return {"signal": self.signal, "exit_code": self.exit_code, "rank": self.rank,
                "stderr_tail": self.stderr_tail, "traceback": self.traceback}


class GuardedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module.split(".")[0] in _REFUSED_MODULES:
            raise pickle.UnpicklingError(
                f"the result contains {module}.{name}; rank functions must return plain data "
                "(the Dask worker process never imports torch): use .tolist() or float()")
        return super().find_class(module, name)


class FrameReader:
    """Incremental reader of length-prefixed pickles from a non-blocking pipe."""

    def __init__(self, fd: int):
        self.fd = fd
        self.buffer = bytearray()
        self.eof = False

    def read(self) -> list[Any]:
        """Everything complete that can be read now. Sets ``eof`` when the writer is gone."""
        while not self.eof:
            try:
                chunk = os.read(self.fd, 1 << 20)
            except BlockingIOError:
                break
            if not chunk:
                self.eof = True
            self.buffer += chunk
        messages = []
        while len(self.buffer) >= HEADER.size:
            (length,) = HEADER.unpack_from(self.buffer)
            end = HEADER.size + length
            if len(self.buffer) < end:
                break
            data = bytes(self.buffer[HEADER.size:end])
            del self.buffer[:end]
            try:
                messages.append(GuardedUnpickler(io.BytesIO(data)).load())
            except Exception as exc:  # noqa: BLE001 - becomes an "error" outcome
                messages.append({"type": "undecodable", "error": f"{type(exc).__name__}: {exc}"})
        return messages


class Rank:
    """One rank process and the parent's ends of its pipes."""

    def __init__(self, rank: int, popen: subprocess.Popen, req_w: int, resp_r: int,
                 log_path: Path):
        self.rank = rank
        self.popen = popen
        self.pid = popen.pid
        self.req_w = req_w
        self.resp_r = resp_r
        self.reader = FrameReader(resp_r)
        self.log_path = log_path
        self.log_offset = 0
        self.pidfd: Optional[int] = None
        if hasattr(os, "pidfd_open"):
            try:
                self.pidfd = os.pidfd_open(self.pid)
            except OSError:  # old kernel or seccomp: fall back to timed liveness checks
                self.pidfd = None

    def returncode(self) -> Optional[int]:
        """Popen-style return code if the process has ended, without reaping it (so its pid,
        and so its process group id, cannot be reused while we may still signal it)."""
        if self.popen.returncode is not None:
            return self.popen.returncode
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # already reaped by someone else
            return self.popen.poll()
        if info is None:
            if not _leader_is_zombie(self.pid):
                return None
            # The main thread has exited but other threads are still being torn down, so the
            # exit is not reportable yet; it will be in moments. Without this a rank killed
            # while idle looked alive and received the next case.
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
        if info.si_code == os.CLD_EXITED:
            return info.si_status
        return -info.si_status  # CLD_KILLED / CLD_DUMPED: killed by a signal

    def signal_group(self, sig: int) -> None:
        if self.popen.returncode is not None:  # reaped: the group id may belong to others now
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def mark_log(self) -> None:
        """Remember where this call's output starts; empty an oversized log first."""
        try:
            size = self.log_path.stat().st_size
            if size > _LOG_TRUNCATE_BYTES:
                os.truncate(self.log_path, 0)  # the rank writes with O_APPEND
                size = 0
        except OSError:
            size = 0
        self.log_offset = size

    def tail(self, lines: int = TAIL_LINES) -> str:
        try:
            with open(self.log_path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                if size <= self.log_offset:
                    return ""
                start = max(self.log_offset, size - _TAIL_BYTES)
                f.seek(start)
                data = f.read()
        except OSError:
            return ""
        text = data.decode("utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def close_fds(self) -> None:
        for fd in (self.req_w, self.resp_r, self.pidfd):
            if fd is not None and fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.req_w = self.resp_r = -1
        self.pidfd = None


def _leader_is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return False


def signal_name(returncode: int) -> Optional[str]:
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"
