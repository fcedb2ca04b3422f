"""The driver of a detached run: :func:`drive` is a Dask task that runs a sweep from inside the
cluster, so the run goes on when the machine that submitted it is gone.

Why a task: the scheduler already keeps tasks alive without their client (``fire_and_forget``)
and reruns a task whose worker died on another worker; a task that submits tasks is plain
Dask (``worker_client``, which also secedes from the worker's thread pool, so the driver takes
no device slot). The driver writes the journal into the run directory, which must be on a
filesystem the workers and the user's machine share (as SLURM clusters have).

The journal stays exact because only the lock holder writes (:mod:`attnbench.results.lock`): a
driver rerun after its worker died waits for the dead holder's lock to go stale, takes it over
and resumes from the journal (the cases the dead driver had in flight are pending again; Dask
drops their futures with its client). If the scheduler itself goes, so does the task: the
driver records why in ``driver.json`` and ``attnbench submit`` with the same ``--out``
resumes.
"""

from __future__ import annotations

import io
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any, Optional

from attnbench.dispatch.driver_state import FINAL, LOG, cancel_requested, write_state
from attnbench.dispatch.lanes import make_run
from attnbench.dispatch.loop import Progress, RunLoop, Stop
from attnbench.errors import UserError, printable
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
            left = progress.total - progress.done
            out.update(total=progress.total + progress.already, already=progress.already,
                       done=progress.done, counts=dict(progress.counts), rate=rate,
                       eta_s=left / rate if rate else None, in_flight=len(run.in_flight),
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
        write_state(self.run_dir, self.state(run, "running"))

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
          dispatch: str = "lanes") -> dict[str, Any]:
    """Dask task: run the sweep's pending cases from inside the cluster, journal in
    ``run_dir``. Returns the final state (also left in ``driver.json``); never raises."""
    from distributed import get_worker, worker_client

    from attnbench.backends import check_backend_name
    from attnbench.cluster.connect import Connection
    from attnbench.cluster.plugin import register
    from attnbench.sweep.load import parse_sweep
    from attnbench.results.store import RunStore

    worker = get_worker()
    base = {"submission": submission, "host": socket.gethostname(), "pid": os.getpid(),
            "worker": str(worker.name), "worker_address": worker.address,
            "scheduler": worker.scheduler.address, "sweep": sweep_path, "run_dir": run_dir,
            "started": time.time()}
    status = StatusWriter(Path(run_dir), base, (submission,))
    store, run = None, None
    try:
        sweep = parse_sweep(sweep_text, sweep_path, check_backend_name)
        from attnbench.results.lock import RunLock

        wait = RunLock(Path(run_dir)).stale_s + LOCK_WAIT_MARGIN_S
        store = RunStore(Path(run_dir), sweep, command=command, retry=retry, lock_wait_s=wait,
                         submission=submission, worker=str(worker.name))
        status.tokens = (submission, store.lock.token)
        if cancel_requested(Path(run_dir), status.tokens):
            final = status.state(None, "cancelled", message="cancelled before it started")
            write_state(Path(run_dir), final)
            return final
        write_state(Path(run_dir), status.state(None, "starting"))
        with io.TextIOWrapper(open_append(Path(run_dir) / LOG), encoding="utf-8") as stream:
            print(f"attnbench: driver {submission} on worker {worker.name} "
                  f"({socket.gethostname()}, pid {os.getpid()}): {len(sweep.cases)} cases, "
                  f"{len(store.done)} already recorded", file=stream, flush=True)
            if store.resume_note:
                print(f"attnbench: warning: {store.resume_note}", file=stream, flush=True)
            with worker_client() as client:  # secedes: the driver holds no worker thread
                register(client)  # submit did; a no-op unless the scheduler lost it
                conn = Connection(client, None, 1, where=f"scheduler {base['scheduler']}")
                run = make_run(store, conn, Progress(0, len(store.done), stream),
                               worker_wait_s, dispatch)
                run.on_tick = status
                summary = run.run()
                stopped = summary.interrupted
            final = status.state(run, "cancelled" if stopped else "finished",
                                 written=summary.written, not_run=summary.not_run)
            print(f"attnbench: driver {final['state']}: {summary.written} records written "
                  f"by this driver", file=stream, flush=True)
    except UserError as exc:
        final = status.state(run, "failed", message=printable(exc, 2000))
    except Exception as exc:  # the driver must leave a reason, whatever happened
        log.exception("attnbench driver failed")
        final = status.state(run, "failed", message=printable(
            f"{type(exc).__name__}: {exc}", 2000))
    try:
        if store is None or store.lock.held:  # a driver that never held the lock writes nothing
            if store is not None or final["state"] != "failed" or _no_live_holder(run_dir):
                write_state(Path(run_dir), final)
    finally:
        if store is not None:
            store.close()
    return final


def _no_live_holder(run_dir: str) -> bool:
    """A driver that could not take the lock leaves driver.json to the one that holds it."""
    from attnbench.results.lock import RunLock

    lock = RunLock(Path(run_dir))
    info = lock.holder()
    return info is None or bool(lock.stale_reason(info))
