"""The lock of a run directory: one ``attnbench run`` at a time appends to it."""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import socket
from pathlib import Path

from attnbench.errors import RunDirError, printable

LOCK = ".lock"
"""Held (``flock``) by the one ``attnbench run`` appending to a run directory; names it."""


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class RunLock:
    """An exclusive ``flock`` on ``<run>/.lock`` for as long as a run appends to the directory.
    The file names its holder (pid, host, command, since when), which a second ``attnbench run``
    on the same directory prints when it is refused. The kernel drops the lock when the holder
    exits, however it exits."""

    def __init__(self, directory: Path):
        self.path = Path(directory) / LOCK
        self._fh = None

    def acquire(self, command: list[str]) -> None:
        try:
            fh = open(self.path, "a+", encoding="utf-8")  # "a+": a holder's note stays readable
        except OSError as exc:
            raise RunDirError(f"{self.path}: cannot create the run's lock file: "
                              f"{exc.strerror or exc}") from None
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            holder = fh.read(2000).strip()
            fh.close()
            try:
                info = json.loads(holder)
                holder = (f"pid {info['pid']} on {info['host']} since {info['since']}: "
                          f"{' '.join(map(str, info['command']))}")
            except (ValueError, TypeError, KeyError):
                holder = holder or "its holder is starting"
            raise RunDirError(f"{self.path.parent}: in use by another attnbench run "
                              f"({printable(holder, 300)}); wait for it to finish or choose "
                              "another --out") from None
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": utc_now(),
                             "command": [str(c) for c in command]}))
        fh.flush()
        self._fh = fh

    @property
    def held(self) -> bool:
        return self._fh is not None

    def release(self) -> None:
        if self._fh is not None:
            self._fh.close()  # closing the descriptor drops the flock
            self._fh = None
