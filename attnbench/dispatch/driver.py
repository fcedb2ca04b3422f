"""The driver of a detached run: :func:`drive` is a Dask task that runs a sweep from inside the
cluster, so the run goes on when the machine that submitted it is gone.

Why a task: the scheduler already keeps tasks alive without their client (``fire_and_forget``)
and reruns a task whose worker died on another worker; a task that submits tasks is plain
Dask (``get_client`` after ``secede``: the driver leaves the worker's thread pool for good, so
it takes no device slot and never waits for one). The driver writes the journal into the run
directory, which must be on a filesystem the workers and the user's machine share (as SLURM
clusters have).

The journal stays exact because only the lock holder writes (:mod:`attnbench.results.lock`):
the driver adopts the lock ``submit`` claimed for it (so no second submit slips in between);
a driver rerun after its worker died waits for the dead holder's lock to go stale, takes it
over and resumes from the journal (the cases the dead driver had in flight are pending again;
Dask drops their futures with its client); a driver whose claim is gone (cancelled before it
started, or taken over) runs nothing. If the scheduler itself goes, the driver records that in
``driver.json`` (``status``: driver gone) and ``attnbench submit`` with the same ``--out``
resumes. Whatever happens, the driver lets go of the lock when it ends, a full disk included.
"""

from __future__ import annotations

import io
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any, Optional

from attnbench.dispatch.driver_state import (FINAL, LOG, STATE, cancel_requested, read_state,
                                             write_state)
from attnbench.dispatch.lanes import make_run
from attnbench.dispatch.loop import Progress, RunLoop, Stop
from attnbench.errors import DiskError, UserError, os_error_text, printable
from attnbench.results.files import open_append

log = logging.getLogger("attnbench")

WHO_RUNS_WHAT_EVERY = 5
"""Ticks between asks to the scheduler for which worker runs which case (one RPC with every
worker's task keys: cheap at 8 workers, ~1 MB at a thousand, so not every second)."""
LOCK_WAIT_MARGIN_S = 30.0
"""A rerun driver waits for a dead driver's lock this long beyond the lock's stale time."""


class StatusWriter:
    """An ``on_tick`` hook of a :class:`RunLoop`: rewrites ``driver.json`` once a second and
    stops the run when ``attnbench cancel`` asks or the lock was taken over."""

    def __init__(self, run_dir: Path, base: dict[str, Any], tokens: tuple[str, ...]):
        self.run_dir, self.base, self.tokens = Path(run_dir), base, tokens
        self.ticks = 0
        self.running: dict[str, list[str]] = {}
        self.last_run: Optional[RunLoop] = None

    def state(self, run: Optional[RunLoop], state: str, **extra: Any) -> dict[str, Any]:
        out = {**self.base, "state": state, **extra}
        if run is not None:
            progress = run.progress
            elapsed = time.perf_counter() - progress.start
            rate = progress.done / elapsed if elapsed > 0 else 0.0
            out.update(total=progress.total + progress.already, already=progress.already,
                       done=progress.done, counts=dict(progress.counts), rate=rate,
                       eta_s=progress.eta_s(), in_flight=len(run.in_flight),
                       queued=run.queued(), workers=len(run.workers),
                       devices=sum(w.devices for w in run.workers),
                       running={} if state in FINAL else self.running)
        return out

    def __call__(self, run: RunLoop) -> None:
        self.last_run = run
        if cancel_requested(self.run_dir, self.tokens):
            raise Stop("cancelled by attnbench cancel")
        if run.store.lock.lost:
            raise Stop("the run directory's lock was taken over (no heartbeat for too long)")
        if self.ticks % WHO_RUNS_WHAT_EVERY == 0:
            self.running = who_runs_what(run)
        self.ticks += 1
        try:
            write_state(self.run_dir, self.state(run, "running"))
        except OSError as exc:  # the disk the journal is on: stop now, resumable
            raise DiskError(f"{os_error_text(exc, str(self.run_dir / STATE))}; the journal "
                            "keeps what was written; rerun to resume") from None

    def finish(self, state: str, **extra: Any) -> None:
        try:
            write_state(self.run_dir, self.state(self.last_run, state, **extra))
        except OSError:
            pass


def local_run_status(store, where: str) -> StatusWriter:
    """The same status file for a plain ``attnbench run``, so ``status`` and ``cancel`` work on
    it too; :meth:`StatusWriter.finish` writes its last state."""
    base = {"submission": None, "host": socket.gethostname(), "pid": os.getpid(),
            "worker": None, "scheduler": where, "run_dir": str(store.dir),
            "started": time.time()}
    return StatusWriter(store.dir, base, (store.lock.token,))


def who_runs_what(run: RunLoop) -> dict[str, list[str]]:
    """Worker name -> ``id label`` of the cases the scheduler has assigned to it (at most 8
    each)."""
    try:
        processing = run.conn.client.processing()
    except Exception:  # a status nicety: never stop a run for it
        return {}
    names = {w.address: w.name for w in run.workers}
    out: dict[str, list[str]] = {}
    for address, keys in processing.items():
        cases = [f"{f.case.id[:10]} {f.case.label}" for k in keys
                 if (f := run.in_flight.get(k)) is not None]
        if cases:
            out[names.get(address, address)] = cases[:8] + (
                [f"... {len(cases) - 8} more"] if len(cases) > 8 else [])
    return out


def drive(sweep_text: str, sweep_path: str, run_dir: str, submission: str, command: list[str],
          retry: tuple[str, ...] = (), worker_wait_s: float = 60.0,
          dispatch: str = "lanes", claim: Optional[str] = None) -> dict[str, Any]:
    """Dask task: run the sweep's pending cases from inside the cluster, journal in
    ``run_dir``. ``claim``: the token of the lock ``attnbench submit`` took for this driver,
    which it adopts (:meth:`~attnbench.results.lock.RunLock.inherit`). Returns the final state
    (also left in ``driver.json`` when this driver may write it); never raises."""
    from distributed import get_client, get_worker, secede

    from attnbench.backends import check_backend_name
    from attnbench.cluster.connect import Connection
    from attnbench.cluster.plugin import register
    from attnbench.results.lock import Cancelled, RunLock
    from attnbench.results.store import RunStore
    from attnbench.sweep.load import parse_sweep

    worker = get_worker()
    where = Path(run_dir)
    base = {"submission": submission, "host": socket.gethostname(), "pid": os.getpid(),
            "worker": str(worker.name), "worker_address": worker.address,
            "scheduler": worker.scheduler.address, "sweep": sweep_path, "run_dir": run_dir,
            "started": time.time()}
    status = StatusWriter(where, base, (submission,))
    store, run, client = None, None, None
    try:
        sweep = parse_sweep(sweep_text, sweep_path, check_backend_name)
        lock = RunLock(where)
        lock_note = dict(submission=submission, worker=str(worker.name))
        wait = lock.stale_s + LOCK_WAIT_MARGIN_S
        if claim is None:  # a submit of an older attnbench: no claim to adopt
            lock.acquire(command, wait, **lock_note)
        else:
            lock.inherit(claim, command, wait, lambda: cancel_requested(where, (submission,)),
                         **lock_note)
        store = RunStore(where, sweep, command=command, retry=retry, lock=lock)
        status.tokens = (submission, store.lock.token)
        if cancel_requested(where, status.tokens):
            final = status.state(None, "cancelled", message="cancelled before it started")
            _leave(where, store, final)
            return final
        write_state(where, status.state(None, "starting"))
        with io.TextIOWrapper(open_append(where / LOG), encoding="utf-8") as stream:
            print(f"attnbench: driver {submission} on worker {worker.name} "
                  f"({socket.gethostname()}, pid {os.getpid()}): {len(sweep.cases)} cases, "
                  f"{len(store.done)} already recorded", file=stream, flush=True)
            if store.resume_note:
                print(f"attnbench: warning: {store.resume_note}", file=stream, flush=True)
            # Out of the worker's thread pool for good: the driver holds no thread a case
            # could use, and never asks for one back. (``worker_client`` rejoins the pool on
            # exit, which waits for a free thread: for a case running on this worker, up to a
            # case's length -- a cancel took 21 s so, issue 25.)
            secede()
            client = get_client()
            register(client)  # submit did; a no-op unless the scheduler lost it
            conn = Connection(client, None, 1, where=f"scheduler {base['scheduler']}")
            run = make_run(store, conn, Progress(0, len(store.done), stream), worker_wait_s,
                           dispatch)
            run.on_tick = status
            summary = run.run()
            final = status.state(run, "cancelled" if summary.interrupted else "finished",
                                 written=summary.written, not_run=summary.not_run)
            print(f"attnbench: driver {final['state']}: {summary.written} records written "
                  f"by this driver", file=stream, flush=True)
    except Cancelled:
        final = status.state(None, "cancelled", message="cancelled before it started")
    except Exception as exc:  # the driver must leave a reason, whatever happened
        final = status.state(run, "failed", **_failure(exc, client, base["scheduler"]))
    _leave(where, store, final)
    return final


def _failure(exc: Exception, client, scheduler: str) -> dict[str, Any]:
    """What ``driver.json`` says of a driver that failed: one line; ``scheduler_lost`` when
    its scheduler went away (whatever Dask raised then: ClosedClientError, CommClosedError, a
    timeout), so ``status`` says the driver is gone and how to resume."""
    if getattr(client, "status", "running") not in ("running", "newly-created"):
        return {"message": f"lost the Dask scheduler {scheduler}; its cases in flight stay "
                           "pending", "scheduler_lost": True}
    if isinstance(exc, UserError):
        return {"message": printable(exc, 2000)}
    if isinstance(exc, OSError):  # the run directory's disk: full, read-only
        return {"message": os_error_text(exc, "the run directory")}
    log.exception("attnbench driver failed")
    return {"message": printable(f"{type(exc).__name__}: {exc}", 2000)}


def _leave(run_dir: Path, store, final: dict[str, Any]) -> None:
    """The driver's last words, then let go of the run directory. Never raises (a full disk
    included): the lock is always released. ``driver.json`` is written by the lock holder, or,
    by a driver that never held the lock, only when nobody holds it and the file is absent or
    this submission's and not final (a refused driver must not overwrite another run's state).
    """
    try:
        if store is not None and store.lock.held:
            write_state(run_dir, final)
        elif _no_live_holder(run_dir):
            last = read_state(run_dir)
            if last is None or (last.get("submission") == final["submission"]
                                and last.get("state") not in FINAL):
                write_state(run_dir, final)
    except OSError:
        pass  # the disk refused the status file; the lock goes all the same
    finally:
        if store is not None:
            store.close()


def _no_live_holder(run_dir: Path) -> bool:
    """A driver that could not take the lock leaves driver.json to the one that holds it."""
    from attnbench.results.lock import RunLock

    lock = RunLock(run_dir)
    info = lock.holder()
    return info is None or bool(lock.stale_reason(info))
