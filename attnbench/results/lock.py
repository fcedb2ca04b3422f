"""One writer per run directory, also across machines on a shared filesystem.

``<run>/.lock`` is created atomically with ``link(2)`` from a private temporary file (the
NFS-safe way: ``O_EXCL`` was not atomic on NFSv2 and ``flock`` is emulated or ignored on many
NFS mounts), so it always holds its holder's whole note: a token, pid, host, command, since
when. While held, a heartbeat thread touches it every :data:`HEARTBEAT_S` seconds.

A lock is *stale* -- its holder is gone and it may be taken over -- when

* the holder ran on this host and its process no longer exists (decided at once), or
* its heartbeat is older than :data:`STALE_S`, measured on the filesystem's own clock (the
  mtime of a file touched now beside it), so clocks that differ between hosts do not matter.

A takeover is serialised by a second link-created file (``.lock.takeover``): only the contender
that creates it may remove the stale lock, after reading it again. A holder whose lock was
taken over (its heartbeat stalled past :data:`STALE_S`, e.g. a frozen NFS mount) sees
:attr:`RunLock.lost` and must stop writing.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Optional

from attnbench.errors import RunDirError, printable
from attnbench.results.files import create_temp

LOCK = ".lock"
TAKEOVER = ".lock.takeover"
HEARTBEAT_S = float(os.environ.get("ATTNBENCH_LOCK_HEARTBEAT_S", "5"))
"""How often a holder touches its lock."""
STALE_S = float(os.environ.get("ATTNBENCH_LOCK_STALE_S", "60"))
"""A heartbeat older than this (12 missed beats) marks a holder on another host as gone. Long
enough for an NFS server's attribute cache (acregmax defaults to 60 s: lowered to 30 s by
``actimeo``-style mounts; a holder touches its lock 12 times in 60 s)."""


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _process_start(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot (tells a reused pid apart)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, start: Optional[str]) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    return start is None or _process_start(pid) in (None, start)


def describe_holder(info: dict) -> str:
    """``pid 12 on gpu-a since 2026-...: attnbench submit ...`` from a lock's note."""
    try:
        text = (f"pid {info['pid']} on {info['host']} since {info['since']}: "
                f"{' '.join(map(str, info['command']))}")
    except (TypeError, KeyError):
        return "its holder is starting"
    return printable(text, 300)


class RunLock:
    """The lock file of one run directory; see the module docstring."""

    def __init__(self, directory: Path, *, stale_s: Optional[float] = None,
                 heartbeat_s: Optional[float] = None):
        self.dir = Path(directory)
        self.path = self.dir / LOCK
        self.stale_s = STALE_S if stale_s is None else stale_s
        self.heartbeat_s = HEARTBEAT_S if heartbeat_s is None else heartbeat_s
        self.token: Optional[str] = None
        self.note: dict[str, Any] = {}
        self.lost = False
        """Set by the heartbeat when the lock file is no longer this holder's."""
        self._stop = threading.Event()
        self._beat: Optional[threading.Thread] = None

    # -- reading ---------------------------------------------------------------------------
    def holder(self) -> Optional[dict]:
        """The current holder's note (``{}`` if unreadable), or None when nobody holds it."""
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return None
        except OSError:
            return {}
        try:
            info = json.loads(text)
        except ValueError:
            return {}
        return info if isinstance(info, dict) else {}

    def fs_now(self) -> float:
        """The filesystem's clock: the mtime of a file touched now in the run directory."""
        try:  # a random name made with O_EXCL | O_NOFOLLOW: a planted link is never written
            fd, probe = create_temp(self.dir, ".clock.")
        except OSError:
            return time.time()
        try:
            return os.fstat(fd).st_mtime
        finally:
            os.close(fd)
            try:
                probe.unlink()
            except OSError:
                pass

    def heartbeat_age(self) -> Optional[float]:
        """Seconds since the holder last touched the lock (filesystem clock), None if free."""
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            return None
        return max(0.0, self.fs_now() - mtime)

    def stale_reason(self, info: Optional[dict]) -> Optional[str]:
        """Why the present lock's holder is gone, or None if it may still be alive."""
        if info is None:
            return "free"
        if info.get("host") == socket.gethostname() and isinstance(info.get("pid"), int):
            if not _alive(info["pid"], info.get("start")):
                return f"pid {info['pid']} on this host has exited"
            return None
        age = self.heartbeat_age()
        if age is not None and age > self.stale_s:
            return f"no heartbeat for {age:.0f} s"
        return None

    # -- taking and giving back ------------------------------------------------------------
    def _try_create(self, note: dict) -> bool:
        tmp = self.dir / f".lock.{note['token']}.tmp"
        try:
            tmp.write_text(json.dumps(note), encoding="utf-8")
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                return False
            except OSError:
                # NFS may lose the reply of a link that happened: the link count tells.
                if tmp.stat().st_nlink != 2:
                    raise
            return True
        finally:
            try:
                tmp.unlink()
            except OSError:
                pass

    def _take_over(self, stale: dict) -> None:
        """Remove a stale lock, once, under ``.lock.takeover`` (itself stale after a minute:
        a contender that died mid-takeover)."""
        guard = self.dir / TAKEOVER
        try:
            if time.time() - guard.stat().st_mtime > max(60.0, self.stale_s):
                guard.unlink()
        except OSError:
            pass
        fd_note = {"token": uuid.uuid4().hex}
        tmp = self.dir / f".takeover.{fd_note['token']}.tmp"
        try:
            tmp.write_text(json.dumps(fd_note))
            os.link(tmp, guard)
        except OSError:
            return  # another contender is taking over; try again later
        finally:
            try:
                tmp.unlink()
            except OSError:
                pass
        try:
            again = self.holder()
            if again is not None and again.get("token") == stale.get("token") \
                    and self.stale_reason(again):
                self.path.unlink()
        except OSError:
            pass
        finally:
            try:
                guard.unlink()
            except OSError:
                pass

    def acquire(self, command: list[str], wait_s: float = 0.0, **extra: Any) -> None:
        """Take the lock, taking over a stale one; wait up to ``wait_s`` for a live holder to
        leave. Raises :class:`RunDirError` naming the holder. ``extra`` goes into the note
        (a driver's submission id, its worker)."""
        token = uuid.uuid4().hex
        note = {"token": token, "pid": os.getpid(), "start": _process_start(os.getpid()),
                "host": socket.gethostname(), "since": utc_now(),
                "command": [str(c) for c in command], **extra}
        deadline = time.monotonic() + wait_s
        while True:
            try:
                if self._try_create(note):
                    break
            except OSError as exc:
                raise RunDirError(f"{self.path}: cannot create the run's lock file: "
                                  f"{exc.strerror or exc}") from None
            info = self.holder()
            if info is not None and self.stale_reason(info):
                self._take_over(info)
                continue
            if time.monotonic() >= deadline:
                raise RunDirError(
                    f"{self.dir}: in use by another attnbench run "
                    f"({describe_holder(info or {})}); wait for it to finish, stop it with "
                    f"`attnbench cancel {self.dir}`, or choose another --out")
            time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))
        self.token, self.note, self.lost = token, note, False
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeat, name="attnbench-lock-heartbeat",
                                      daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            if not self.owned():
                self.lost = True
                return
            try:
                os.utime(self.path)
            except OSError:
                pass  # a filesystem hiccup: the next beat tries again

    def owned(self) -> bool:
        info = self.holder()
        return info is not None and info.get("token") == self.token

    @property
    def held(self) -> bool:
        return self.token is not None

    def release(self) -> None:
        if self.token is None:
            return
        self._stop.set()
        if self._beat is not None and self._beat is not threading.current_thread():
            self._beat.join(timeout=5)
        if self.owned():
            try:
                self.path.unlink()
            except OSError:
                pass
        self.token = None
