"""One writer per run directory, also across machines on a shared filesystem.

``<run>/.lock`` is created atomically with ``link(2)`` from a private temporary file (the
NFS-safe way: ``O_EXCL`` was not atomic on NFSv2 and ``flock`` is emulated or ignored on many
NFS mounts), so it always holds its holder's whole note: a random token (who holds it), pid,
host, the PID namespace it runs in, command, since when. While held, a heartbeat thread
touches it every :data:`HEARTBEAT_S` seconds.

A lock is *stale* -- its holder is gone and it may be taken over -- when

* its heartbeat is older than :data:`STALE_S`, measured on the filesystem's own clock (the
  mtime of a file touched now beside it), so clocks that differ between hosts do not matter;
  whatever its pid says: a pid means nothing in another PID namespace, and the same hostname
  does not make the same namespace (containers with host networking, Kubernetes
  ``hostNetwork``: a run there was taken over while still writing, issue 25), or
* the holder runs in this very PID namespace on this boot of this kernel (the note's
  ``space``: the boot id and the namespace's inode, :func:`pid_space`) and its process no
  longer exists (decided at once: a crashed ``run`` does not block the next one for a minute).

A takeover is serialised by a second link-created file (``.lock.takeover``): only the contender
that creates it may remove the stale lock, after reading it again. A holder whose lock was
taken over (its heartbeat stalled past :data:`STALE_S`, e.g. a frozen NFS mount) sees
:attr:`RunLock.lost` and must stop writing.

``attnbench submit`` holds the lock from its checks until the driver it started holds it: the
submit's lock is a *claim* (its note names the submission), which only that driver adopts
(:meth:`RunLock.inherit`: the lock file is replaced by the driver's note under the same
guard), so two submits to one run directory can never both be accepted. A driver rerun by Dask
after its worker died takes over only a stale lock of its own submission; a driver whose
claim is gone (cancelled, or taken over once stale) runs nothing.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from attnbench.errors import RunDirError, printable
from attnbench.results.files import create_temp
from attnbench.validation import read_bounded

LOCK = ".lock"
TAKEOVER = ".lock.takeover"
HEARTBEAT_S = float(os.environ.get("ATTNBENCH_LOCK_HEARTBEAT_S", "5"))
"""How often a holder touches its lock."""
STALE_S = float(os.environ.get("ATTNBENCH_LOCK_STALE_S", "60"))
"""A heartbeat older than this (12 missed beats) marks a holder on another host as gone. Long
enough for an NFS server's attribute cache (acregmax defaults to 60 s: lowered to 30 s by
``actimeo``-style mounts; a holder touches its lock 12 times in 60 s)."""


NOTE_LIMIT = 1 << 20
"""Bytes of a lock note read at most (ours are under a kilobyte; a planted giant is unreadable,
not a MemoryError)."""
PID_MAX = 1 << 22
"""Linux's largest pid_max: a note's pid beyond it is nobody's (and would overflow kill(2))."""


class Cancelled(Exception):
    """Raised by :meth:`RunLock.inherit` when ``attnbench cancel`` asked the waiting driver to
    stop: it takes nothing."""


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _process_start(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot (tells a reused pid apart)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


@functools.lru_cache(maxsize=1)
def pid_space() -> Optional[str]:
    """This process's PID namespace on this boot of this kernel, ``<boot id>/pid:[<inode>]``;
    None where /proc does not tell (then only the heartbeat says whether a holder is alive).
    The boot id is random per boot and shared by every container on the host; the namespace
    inode tells containers apart (and the host's own namespace has the same inode on every
    machine, hence the boot id)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
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
        try:  # bounded, and never waiting on a FIFO planted there
            data = read_bounded(self.path, NOTE_LIMIT)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):  # a FIFO, a device, over the limit: not a holder's note
            return {}
        try:
            info = json.loads(data.decode("utf-8", "replace"))
        except (ValueError, RecursionError):
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
        pid = info.get("pid")
        if (isinstance(pid, int) and 0 < pid < PID_MAX and info.get("space") is not None
                and info.get("space") == pid_space()):
            if not _alive(pid, info.get("start")):
                return f"pid {pid} on this host has exited"
            return None  # alive here: its pid is the whole truth
        age = self.heartbeat_age()
        if age is not None and age > self.stale_s:
            return f"no heartbeat for {age:.0f} s"
        return None

    # -- taking and giving back ------------------------------------------------------------
    def _note(self, command: list[str], extra: dict) -> dict:
        return {"token": uuid.uuid4().hex, "pid": os.getpid(),
                "start": _process_start(os.getpid()), "host": socket.gethostname(),
                "space": pid_space(), "since": utc_now(), "command": [str(c) for c in command],
                **extra}

    def _try_create(self, note: dict) -> bool:
        tmp = self.dir / f".lock.{note['token']}.tmp"
        try:
            _write_new(tmp, json.dumps(note))
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
            _unlink(tmp)

    @contextlib.contextmanager
    def _guard(self) -> Iterator[bool]:
        """``.lock.takeover``, link-created: True when this process holds it (for the block),
        False when another contender does. Itself stale after a minute (a contender that died
        holding it; what it guards takes milliseconds)."""
        guard = self.dir / TAKEOVER
        try:
            if time.time() - guard.stat().st_mtime > max(60.0, self.stale_s):
                guard.unlink()
        except OSError:
            pass
        tmp = self.dir / f".takeover.{uuid.uuid4().hex}.tmp"
        got = False
        try:
            _write_new(tmp, "")
            os.link(tmp, guard)
            got = True
        except OSError:
            pass  # another contender holds it; try again later
        finally:
            _unlink(tmp)
        try:
            yield got
        finally:
            if got:
                _unlink(guard)

    def _take_over(self, stale: dict) -> None:
        """Remove a stale lock, once, under the guard, after reading it again."""
        with self._guard() as got:
            again = self.holder() if got else None
            if again is not None and again.get("token") == stale.get("token") \
                    and self.stale_reason(again):
                _unlink(self.path)

    def _replace_claim(self, claim: str, note: Optional[dict]) -> bool:
        """Under the guard, if the lock is still the claim ``claim``: replace it with ``note``
        (adopt it) or remove it (``note`` None). False when the guard was busy or the lock is
        no longer that claim."""
        with self._guard() as got:
            info = self.holder() if got else None
            if info is None or info.get("token") != claim:
                return False
            if note is None:
                _unlink(self.path)
                return True
            tmp = self.dir / f".lock.{note['token']}.tmp"
            try:
                _write_new(tmp, json.dumps(note))
                os.replace(tmp, self.path)  # atomic: a reader sees the claim or the driver
            finally:
                _unlink(tmp)
            return True

    def acquire(self, command: list[str], wait_s: float = 0.0, **extra: Any) -> None:
        """Take the lock, taking over a stale one; wait up to ``wait_s`` for a live holder to
        leave. Raises :class:`RunDirError` naming the holder. ``extra`` goes into the note
        (a driver's submission id, its worker; ``claim=True`` for a submit's claim)."""
        note = self._note(command, extra)
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
                raise self._in_use(info)
            time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))
        self._start(note)

    def inherit(self, claim: str, command: list[str], wait_s: float = 0.0,
                cancelled: Optional[Callable[[], bool]] = None, **extra: Any) -> None:
        """Take the lock as the driver a submit started (see the module docstring): adopt the
        claim whose token is ``claim``; or, when an earlier run of this same driver (the note's
        ``submission`` is ``extra["submission"]``) holds the lock, wait up to ``wait_s`` for it
        to go stale and take it over. Anything else -- the claim gone, another run holding the
        directory -- is a :class:`RunDirError`: never a second writer. ``cancelled()`` is asked
        before each look: True removes the claim if it is still there, and raises
        :class:`Cancelled`."""
        note = self._note(command, extra)
        submission = extra.get("submission")
        deadline = time.monotonic() + wait_s
        while True:
            info = self.holder()
            mine = info is not None and info.get("token") == claim
            if cancelled is not None and cancelled():
                if mine:
                    self._replace_claim(claim, None)
                raise Cancelled()
            if mine:
                if self._replace_claim(claim, note):
                    break
            elif info is None or info.get("submission") != submission:
                what = (f"another attnbench run holds it ({describe_holder(info)})" if info
                        else "the lock is free: its claim was cancelled or taken over")
                raise RunDirError(f"{self.dir}: this driver's claim on the run directory is "
                                  f"gone; {what}; nothing was run")
            elif self.stale_reason(info):  # an earlier run of this driver, gone
                self._take_over(info)
                if self._try_create(note):
                    break
                continue
            elif time.monotonic() >= deadline:
                raise self._in_use(info)
            time.sleep(0.2 if mine else min(1.0, max(0.05, deadline - time.monotonic())))
        self._start(note)

    def withdraw(self, claim: str) -> bool:
        """Remove the claim ``claim`` if it still is the lock (``attnbench cancel`` of a driver
        not started yet); False when it is not (adopted meanwhile, or gone)."""
        for _ in range(50):  # the guard is held for milliseconds: 50 x 0.1 s is plenty
            info = self.holder()
            if info is None or info.get("token") != claim:
                return False
            if self._replace_claim(claim, None):
                return True
            time.sleep(0.1)
        return False

    def _in_use(self, info: Optional[dict]) -> RunDirError:
        return RunDirError(
            f"{self.dir}: in use by another attnbench run "
            f"({describe_holder(info or {})}); wait for it to finish, stop it with "
            f"`attnbench cancel {self.dir}`, or choose another --out")

    def _start(self, note: dict) -> None:
        self.token, self.note, self.lost = note["token"], note, False
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

    def _stop_beating(self) -> None:
        self._stop.set()
        if self._beat is not None and self._beat is not threading.current_thread():
            self._beat.join(timeout=5)

    def hand_over(self) -> None:
        """Stop beating and forget the lock without removing it: a submit's claim, now its
        driver's (or waiting for it: it goes stale after :data:`STALE_S` if the driver never
        starts)."""
        if self.token is not None:
            self._stop_beating()
            self.token = None

    def release(self) -> None:
        """Stop beating and remove the lock if it is still this holder's. Never raises (it runs
        in cleanup, also on a full or read-only disk)."""
        if self.token is None:
            return
        try:
            self._stop_beating()
            if self.owned():
                _unlink(self.path)
        finally:
            self.token = None


def _write_new(path: Path, text: str) -> None:
    """Create ``path`` (it must not exist; a planted link is not followed) holding ``text``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
