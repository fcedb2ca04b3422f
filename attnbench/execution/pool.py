"""Rank pools: warm child processes that run cases outside the Dask worker's own process.

A :class:`RankPool` owns ``world_size`` rank processes (see :mod:`attnbench.execution.child`),
started lazily with :class:`subprocess.Popen` (Dask workers are daemonic, so ``multiprocessing``
cannot start children there), each in its own session so that its whole process group can be
killed. They stay warm across calls::

    pool = RankPool(world_size=1, threads=1)
    outcome = pool.run("attnbench.execution.case_runner:run_payload", payload, timeout=300)
    if outcome.kind == "ok":
        record = outcome.result

Every rank receives the same call; rank ``r`` sees ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` and
``LOCAL_WORLD_SIZE`` in its environment (plus ``ATTNBENCH_POOL_DIR`` and ``ATTNBENCH_POOL_START``
for a torch.distributed rendezvous, see :mod:`attnbench.parallel.group`), and rank 0's result is
returned. Whatever goes wrong comes back as an :class:`Outcome` instead of an exception:

======== ========================================================== ==========================
kind     what happened                                              the ranks afterwards
======== ========================================================== ==========================
ok       every rank returned                                        kept warm
error    an exception escaped the function (traceback kept)         replaced (state unknown:
                                                                    sticky CUDA errors, half-
                                                                    done collectives)
oom      MemoryError / torch.OutOfMemoryError / allocator failure   kept (after gc and
                                                                    ``empty_cache``) when
                                                                    world_size is 1, else
                                                                    replaced
crash    a rank died: signal (SIGSEGV, SIGABRT, SIGKILL, ...) or    replaced
         exit status, or it could not start
timeout  no answer in time: the hung ranks get SIGUSR1 (Python      replaced
         stacks into the log), then their groups SIGTERM and,
         after a short grace, SIGKILL
======== ========================================================== ==========================

"Replaced" means the ranks are stopped now and the next :meth:`RankPool.run` starts fresh ones.
A function can also ask for that after answering normally, with
:func:`attnbench.execution.child.recycle_after_call` (say, after it caught a CUDA error that
leaves the context unusable).

The parent (a Dask worker) never imports torch: results cross the pipe as pickles and are
unpickled with torch and triton refused, so a function must return plain data (``.tolist()``,
``float(...)``), not tensors. Each rank's stdout and stderr go to one log file (in that order of
lines as written; the child runs unbuffered); ``Outcome.stderr_tail`` is the last lines written
during the call.

:class:`~attnbench.execution.pool_set.PoolSet` (its own module) hands warm pools to concurrent
Dask worker threads. A Dask worker's PoolSet is held by its worker plugin (:mod:`attnbench.cluster.plugin`), which closes it when the worker
closes; :func:`get_default_poolset` is a per-process one for code outside a Dask worker, closed
at interpreter exit. A rank also exits by itself when its parent dies: its request pipe hangs
up and a watchdog thread kills the rank's process group.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import pickle
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from attnbench import package_face
from attnbench.execution.call_clock import CallClock
from attnbench.execution.child import write_frame, write_message
from attnbench.execution.ranks import OUTCOME_KINDS, Outcome, Rank, signal_name
from attnbench.resources import ENV_POOL_DIR, ENV_POOL_START

log = logging.getLogger("attnbench.execution")

__all__ = ["Outcome", "RankPool", "OUTCOME_KINDS"]

_DUMP_WAIT_S = 0.3
"""After SIGUSR1, time for faulthandler to write the stacks of a hung rank (it is a few kB)."""
_EXIT_WAIT_S = 2.0
"""After a rank's pipe hangs up, how long it may take to finish dying before we kill it."""
_POLL_SLICE_S = 0.5
"""Longest single wait without checking rank liveness, where pidfd_open is missing."""
_PEER_DEATH_WAIT_S = 0.5
"""When a rank of a multi-rank pool answers with an error, how long to look for another rank
that died: a peer's death makes the survivors' collectives fail (gloo: "Connection closed by
peer") about as soon as the dead rank's sockets close, often before its exit is visible."""
EnvSpec = Union[None, Mapping[str, str], Sequence[Mapping[str, str]]]

# Bootstrap of a rank: make this attnbench importable whatever the worker's cwd, then hand over.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_BOOT = ("import sys; sys.path.insert(0, {root!r}); "
         "from attnbench.execution.child import main; sys.exit(main())")


def _is_bad(message: dict) -> bool:
    return message["type"] in ("failed", "undecodable") or (
        message["type"] == "reply" and message["kind"] != "ok")


class RankPool:
    """``world_size`` warm rank processes running one call at a time.

    ``env``: extra environment variables for every rank (a mapping), or one mapping per rank
    (a sequence of ``world_size`` mappings), over this process's environment.
    ``threads``: ``torch.set_num_threads`` in each rank (imports torch when the rank starts, and
    sets ``OMP_NUM_THREADS``/``MKL_NUM_THREADS``); None leaves torch alone.
    ``preload``: modules each rank imports when it starts, so their import time is paid by the
    start and not by the first call's timeout.
    ``start_timeout``: seconds a rank may take to start (separate from each call's timeout).
    ``term_grace``: seconds between SIGTERM and SIGKILL when ranks are stopped.
    ``log_dir``: where rank logs go (default: a temporary directory removed by :meth:`close`).

    Thread-safe, but calls are serialised: lease pools from a :class:`PoolSet` for concurrency.
    """

    def __init__(self, world_size: int = 1, env: EnvSpec = None, threads: Optional[int] = None,
                 *, preload: Sequence[str] = (), start_timeout: float = 120.0,
                 term_grace: float = 1.0, log_dir: Union[str, Path, None] = None):
        if world_size < 1:
            raise ValueError(f"world_size: got {world_size}, expected >= 1")
        if env is not None and not isinstance(env, Mapping) and len(env) != world_size:
            raise ValueError(f"env: got {len(env)} per-rank mappings, expected world_size="
                             f"{world_size}")
        self.world_size = world_size
        self.env = env
        self.threads = threads
        self.preload = tuple(preload)
        self.start_timeout = start_timeout
        self.term_grace = term_grace
        self.starts = 0
        """How many times ranks were started (1 + replacements)."""
        self._log_dir_given = log_dir is not None
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self._ranks: list[Rank] = []
        self._lock = threading.Lock()
        self._call_id = 0
        self._closed = False
        self._owner_pid = os.getpid()

    # -- public ---------------------------------------------------------------------------------

    @property
    def pids(self) -> tuple[int, ...]:
        """Process ids of the current ranks (empty when none are running)."""
        return tuple(r.pid for r in self._ranks)

    @property
    def log_dir(self) -> Optional[Path]:
        return self._log_dir

    def start(self) -> Optional[Outcome]:
        """Start the ranks now if they are not running. None on success, else the failure."""
        with self._lock:
            self._check_open()
            return self._ensure_started()[1]

    def run(self, func_ref: str, payload: Any, timeout: Optional[float],
            on_compile: Optional[Callable[[bool], None]] = None) -> Outcome:
        """Call ``func_ref`` ("module:function") with ``payload`` on every rank; see the module
        docstring for the outcomes. ``timeout`` (seconds, None for no limit) covers the call,
        not the start of fresh ranks. ``on_compile(True | False)``: told when the call's
        backend starts and ends compiling (:class:`CallClock`). Raises only for the caller's
        own mistakes (closed pool, unpicklable payload)."""
        with self._lock:
            self._check_open()
            data = pickle.dumps({"type": "call", "id": self._call_id + 1, "func": func_ref,
                                 "payload": payload}, protocol=pickle.HIGHEST_PROTOCOL)
            self._call_id += 1
            t0 = time.perf_counter()
            started, failed = self._ensure_started()
            start_s = time.perf_counter() - t0 if started else 0.0
            if failed is not None:
                failed.wall_s = failed.start_s = start_s
                return failed
            pids = self.pids
            deadline = math.inf if timeout is None else time.monotonic() + timeout
            try:
                outcome = self._send_all(data) or self._collect(self._call_id, deadline, timeout,
                                                                  on_compile)
            except BaseException:  # e.g. KeyboardInterrupt: the ranks are mid-call, drop them
                self._stop()
                raise
            outcome.pids = pids
            outcome.start_s = start_s
            outcome.wall_s = time.perf_counter() - t0
            keep = outcome.kind == "ok" or (outcome.kind == "oom" and self.world_size == 1)
            if not keep or outcome.recycle:
                self._stop()
            return outcome

    def close(self) -> None:
        """Stop the ranks (politely, then by force) and remove the log directory."""
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._owner_pid:  # a forked copy: the ranks belong to the original
            return
        if not self._lock.acquire(timeout=0.1):
            # A call is in flight in another thread: kill the ranks so that it returns (as a
            # crash) at once; that thread reaps them.
            for rank in list(self._ranks):
                rank.signal_group(signal.SIGKILL)
            self._lock.acquire()
        try:
            self._stop(polite=True)
            if self._log_dir is not None and not self._log_dir_given:
                shutil.rmtree(self._log_dir, ignore_errors=True)
                self._log_dir = None
        finally:
            self._lock.release()

    def __enter__(self) -> "RankPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else (f"pids={list(self.pids)}" if self._ranks else "cold")
        return f"RankPool(world_size={self.world_size}, threads={self.threads}, {state})"

    # -- starting -------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this RankPool is closed")
        if os.getpid() != self._owner_pid:
            raise RuntimeError("a RankPool cannot be used in a forked copy of its process")

    def _ensure_started(self) -> tuple[bool, Optional[Outcome]]:
        """Start ranks if none run or one died while idle (then all are replaced).
        Returns (whether ranks were started, the failure if starting failed)."""
        if self._ranks and all(r.returncode() is None for r in self._ranks):
            return False, None
        if self._ranks:
            dead = next(r for r in self._ranks if r.returncode() is not None)
            log.warning("rank pool: rank %d (pid %d) died while idle (code %s); restarting",
                        dead.rank, dead.pid, dead.returncode())
            self._stop()
        return True, self._start()

    def _child_env(self, rank: int) -> dict[str, str]:
        env = dict(os.environ)
        if self.threads:
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(self.threads)
        extra = self.env if isinstance(self.env, Mapping) or self.env is None else self.env[rank]
        env.update({str(k): str(v) for k, v in (extra or {}).items()})
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(self.world_size),
                   LOCAL_WORLD_SIZE=str(self.world_size), PYTHONUNBUFFERED="1")
        # Rendezvous for torch.distributed (attnbench.parallel.group): rank 0 binds a TCPStore
        # on a free port and writes it into this pool's directory under this start's number,
        # so ranks of a rebuilt pool never read a dead store's port.
        env.update({ENV_POOL_DIR: str(self._log_dir), ENV_POOL_START: str(self.starts)})
        return env

    def _spawn(self, rank: int) -> Rank:
        if self._log_dir is None:
            self._log_dir = Path(tempfile.mkdtemp(prefix="attnbench-pool-"))
        self._log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self._log_dir / f"rank{rank}.log"
        # O_APPEND: the parent may truncate the log under a running rank.
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        config = json.dumps({"rank": rank, "world_size": self.world_size,
                             "rfd": req_r, "wfd": resp_w})
        try:
            popen = subprocess.Popen(
                [sys.executable, "-c", _BOOT.format(root=_PACKAGE_ROOT), config],
                stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd,
                pass_fds=(req_r, resp_w), start_new_session=True, close_fds=True,
                env=self._child_env(rank))
        except BaseException:
            for fd in (req_w, resp_r):
                os.close(fd)
            raise
        finally:
            for fd in (req_r, resp_w, log_fd):
                os.close(fd)
        os.set_blocking(resp_r, False)
        return Rank(rank, popen, req_w, resp_r, log_path)

    def _start(self) -> Optional[Outcome]:
        self.starts += 1
        deadline = time.monotonic() + self.start_timeout
        init = {"type": "init", "sys_path": list(sys.path), "threads": self.threads,
                "preload": list(self.preload)}
        try:
            for rank in range(self.world_size):
                self._ranks.append(self._spawn(rank))
        except BaseException:
            self._stop()
            raise
        failed = None
        for rank in self._ranks:
            try:
                write_message(rank.req_w, init)  # small: fits in the pipe, never blocks
            except BrokenPipeError:
                failed = self._dead_outcome(rank, "")
                break
        if failed is None:
            replies, failed = self._gather(
                lambda m: m["type"] in ("ready", "failed", "undecodable"), deadline)
            if failed is not None and failed.kind == "timeout":
                failed.kind = "crash"
                failed.summary = f"did not start within {self.start_timeout:g} s"
            for rank, message in sorted(replies.items()):
                if failed is None and message["type"] != "ready":
                    text = message.get("traceback") or message.get("error", "")
                    failed = Outcome(kind="error", rank=rank, traceback=text,
                                     summary=(text.strip().splitlines() or ["?"])[-1][:500],
                                     stderr_tail=self._ranks[rank].tail())
        if failed is None:
            log.debug("rank pool started: world_size=%d pids=%s", self.world_size, self.pids)
            return None
        failed.note = "; ".join(filter(None, ["the rank processes failed to start", failed.note]))
        failed.pids = self.pids
        self._stop()
        return failed

    # -- one call -------------------------------------------------------------------------------

    def _send_all(self, data: bytes) -> Optional[Outcome]:
        for rank in self._ranks:
            rank.mark_log()
        for rank in self._ranks:
            try:
                write_frame(rank.req_w, data)
            except BrokenPipeError:
                return self._dead_outcome(rank, "")
        return None

    def _collect(self, call_id: int, deadline: float, timeout: Optional[float],
                 on_compile: Optional[Callable[[bool], None]] = None) -> Outcome:
        replies, failed = self._gather(
            lambda m: m["type"] == "undecodable" or (m["type"] == "reply" and m["id"] == call_id),
            deadline, timeout, call_id, on_compile)
        if failed is not None:
            return failed
        for rank, message in sorted(replies.items()):
            if message["type"] == "undecodable":
                return Outcome(kind="error", rank=rank, summary=message["error"][:500],
                               traceback=message["error"], stderr_tail=self._ranks[rank].tail(),
                               note="the rank's answer could not be unpickled by the parent")
            if message["kind"] != "ok":
                dead = self._dead_peer(rank)
                if dead is not None:  # the root cause; this rank's error is its consequence
                    return self._dead_outcome(dead, f"rank {rank} then failed: "
                                                    f"{message['summary']}")
                return self._reply_outcome(rank, message)
        first = replies[0]
        recycle = "; ".join(f"rank {r}: {m['recycle']}" for r, m in sorted(replies.items())
                            if m.get("recycle"))
        return Outcome(kind="ok", result=first["result"], rank=0, duration_s=first["duration_s"],
                       stderr_tail=self._ranks[0].tail(), recycle=recycle)

    def _dead_peer(self, rank: int) -> Optional[Rank]:
        """Another rank that has died, waiting up to :data:`_PEER_DEATH_WAIT_S` for one; None
        at once for a single-rank pool."""
        others = [r for r in self._ranks if r.rank != rank]
        end = time.monotonic() + (_PEER_DEATH_WAIT_S if others else 0.0)
        while others:
            for other in others:
                if other.returncode() is not None:
                    return other
            if time.monotonic() >= end:
                return None
            time.sleep(0.005)
        return None

    def _reply_outcome(self, rank: int, message: dict) -> Outcome:
        return Outcome(kind=message["kind"], rank=rank, traceback=message["traceback"],
                       summary=message["summary"], duration_s=message["duration_s"],
                       stderr_tail=self._ranks[rank].tail(), recycle=message.get("recycle", ""))

    def _gather(self, wanted, deadline: float, timeout: Optional[float] = None,
                call_id: Optional[int] = None,
                on_compile: Optional[Callable[[bool], None]] = None,
                ) -> tuple[dict[int, dict], Optional[Outcome]]:
        """Wait for one ``wanted`` message from every rank. Returns early when a rank sends a
        bad one (the caller finds it in the replies), dies without answering, or the deadline
        passes (then the failure outcome is returned). While a rank of call ``call_id`` says it
        compiles, the deadline stands still (:class:`CallClock`)."""
        clock = CallClock(deadline, on_compile)
        replies: dict[int, dict] = {}
        poller = select.poll()
        by_fd: dict[int, Rank] = {}
        for rank in self._ranks:
            for fd in (rank.resp_r, rank.pidfd):
                if fd is not None:
                    poller.register(fd, select.POLLIN)
                    by_fd[fd] = rank
        # Without pidfds, a rank whose pipe a grandchild keeps open is noticed by polling.
        slice_s = 3600.0 if all(r.pidfd is not None for r in self._ranks) else _POLL_SLICE_S
        pending = list(self._ranks)
        while pending:
            remaining = clock.remaining()
            if remaining <= 0:
                outcome = self._timeout_outcome(pending, timeout)
                if clock.compiling:
                    outcome.summary = (f"still compiling after {clock.grace_s():g} s (a "
                                       "compile's own limit, apart from the case's timeout)")
                elif clock.compiled_s:
                    outcome.note += (f"; {clock.compiled_s:.1f} s of compiling were not "
                                     "counted against the timeout")
                return replies, outcome
            events = poller.poll(max(1, math.ceil(min(remaining, slice_s) * 1000)))
            active = {by_fd[fd].rank for fd, _ in events} if events else {r.rank for r in pending}
            for rank in pending:
                if rank.rank not in active:
                    continue
                for message in rank.reader.read():
                    if wanted(message):  # others are stale replies of abandoned calls
                        replies[rank.rank] = message
                    elif message["type"] == "compile" and message.get("id") == call_id:
                        clock.note(rank.rank, bool(message.get("start")))
                if rank.rank in replies:
                    if _is_bad(replies[rank.rank]):
                        return replies, None
                    for fd in (rank.resp_r, rank.pidfd):
                        if fd is not None:
                            poller.unregister(fd)
                elif rank.reader.eof or rank.returncode() is not None:
                    return replies, self._dead_outcome(rank, "")
            pending = [r for r in pending if r.rank not in replies]
        return replies, None

    def _dead_outcome(self, rank: Rank, note: str) -> Outcome:
        """A rank's pipe hung up or its process ended without answering."""
        code = rank.returncode()
        waited = time.monotonic() + _EXIT_WAIT_S
        while code is None and time.monotonic() < waited:  # the pipe hangs up before the exit
            if rank.pidfd is not None:
                select.select([rank.pidfd], [], [], waited - time.monotonic())
            else:
                time.sleep(0.005)
            code = rank.returncode()
        notes = [note] if note else []
        if code is None:
            notes.append("it closed its reply pipe but did not exit; killed")
            rank.signal_group(signal.SIGKILL)
        sig = signal_name(code) if code is not None else None
        if sig is not None:
            summary = f"killed by {sig}"
        elif code is not None:
            summary = f"exited with status {code} without answering"
        else:
            summary = "hung up without answering"
        if self._closed:
            notes.append("the pool was closed during the call")
        elif code == -signal.SIGKILL:
            notes.append("the harness did not send this SIGKILL: the kernel OOM killer is the "
                         "usual sender (check dmesg or the cgroup's memory.events)")
        return Outcome(kind="crash", rank=rank.rank, signal=sig, exit_code=code, summary=summary,
                       note="; ".join(notes), stderr_tail=rank.tail())

    def _timeout_outcome(self, hung: list[Rank], timeout: Optional[float]) -> Outcome:
        for rank in hung:  # faulthandler prints every thread's Python stack into the log
            if rank.returncode() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(rank.pid, signal.SIGUSR1)
        time.sleep(_DUMP_WAIT_S)
        first = hung[0]
        limit = f"{timeout:g} s" if timeout is not None else "the start timeout"
        return Outcome(kind="timeout", rank=first.rank,
                       summary=f"no answer within {limit}",
                       note=(f"ranks {[r.rank for r in hung]} hung; their process groups were "
                             f"killed (SIGTERM, then SIGKILL after {self.term_grace:g} s); "
                             "Python stacks at the time are in stderr_tail"),
                       stderr_tail=first.tail())

    # -- stopping -------------------------------------------------------------------------------

    def _stop(self, polite: bool = False) -> None:
        """End every rank and its process group, reap them and forget them."""
        ranks, self._ranks = self._ranks, []
        if not ranks:
            return
        if polite:
            for rank in ranks:
                with contextlib.suppress(OSError):
                    write_message(rank.req_w, {"type": "exit"})
        for rank in ranks:  # EOF on the request pipe also ends an idle rank
            with contextlib.suppress(OSError):
                os.close(rank.req_w)
            rank.req_w = -1
        if polite:
            self._wait_exit(ranks, self.term_grace)
        for rank in ranks:
            if rank.returncode() is None:
                rank.signal_group(signal.SIGTERM)
        self._wait_exit(ranks, self.term_grace)
        for rank in ranks:  # also whatever the rank started in its group
            rank.signal_group(signal.SIGKILL)
        for rank in ranks:
            try:
                rank.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:  # unkillable (D state): leave it, say so
                log.error("rank pool: pid %d did not die after SIGKILL", rank.pid)
            rank.close_fds()

    @staticmethod
    def _wait_exit(ranks: list[Rank], seconds: float) -> None:
        end = time.monotonic() + seconds
        while any(r.returncode() is None for r in ranks) and time.monotonic() < end:
            time.sleep(0.005)


# PoolSet and get_default_poolset moved to attnbench.execution.pool_set (this module had
# reached its size limit); the old names still import, with a DeprecationWarning.
__getattr__ = package_face(__name__, {}, moved={
    "PoolSet": "attnbench.execution.pool_set",
    "get_default_poolset": "attnbench.execution.pool_set"})[1]
