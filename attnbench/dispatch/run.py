"""The client side of a run: submit pending cases, stream records into the journal. This
module is the ``tasks`` dispatch (:class:`SweepRun`, one Dask task per case) and
:func:`run_pending`; the loop it shares with ``lanes`` is :mod:`attnbench.dispatch.loop`.

The journal is the truth (the Dask scheduler persists nothing). Rules that keep it exact:

* At most ``2 x devices`` cases are in flight, so a large sweep does not flood the scheduler and
  an interruption loses only those (they stay pending; the next run of the same sweep does
  them).
* Records are appended the moment they arrive; a case gets one record per run: a result for a
  case whose record changed since the run began is not written (``duplicated`` counts such
  arrivals). A case run again (``lost``/``skipped`` on resume, ``--retry``, ``--case``) gets a
  new record with the next ``attempt`` number; the last record of a case is its result.
* A case no connected worker can satisfy (GPU kind missing, too few devices on one worker) is
  recorded ``skipped`` with the reason before it is submitted: in Dask it would wait in
  ``no-worker`` forever. One whose workers left during the run (they were seen) is held for
  ``worker_wait_s`` in case they come back, then left pending, unrecorded.
* A worker that dies mid-case: Dask reruns its cases elsewhere; after ``allowed-failures``
  (default 3) deaths a case ends in KilledWorker and is recorded ``lost``.
* Ctrl-C or SIGTERM: in-flight cases are cancelled and stay pending; a record being written is
  finished first. Losing the scheduler raises :class:`~attnbench.errors.ClusterError` with one
  line; nothing in flight is recorded.
"""

from __future__ import annotations

import queue as queue_mod
import time
from typing import Callable, Optional, TextIO

from attnbench.cluster.connect import Connection, plan_case
from attnbench.cluster.task import run_case_task_text
from attnbench.dispatch.loop import Progress, RunLoop, RunSummary, _Flight
from attnbench.resources import DEVICE
from attnbench.results.records import make_record
from attnbench.results.store import RunStore
from attnbench.sweep.case import Case

_NOT_GATHERED = object()


def _by_resources(batch: list[tuple[Case, dict]]) -> list[tuple[dict, list[Case]]]:
    """Cases grouped by the resources they ask for, in order of first appearance."""
    groups: dict[tuple, tuple[dict, list[Case]]] = {}
    for case, resources in batch:
        groups.setdefault(tuple(sorted(resources.items())), (resources, []))[1].append(case)
    return list(groups.values())


def run_pending(store: RunStore, conn: Connection, stream: Optional[TextIO] = None, *,
                worker_wait_s: float = 60.0, quiet: bool = False,
                on_tick: Optional[Callable[[RunLoop], None]] = None,
                run_class: Optional[type] = None) -> RunSummary:
    """Run the store's pending cases on ``conn``; see the module docstring for the rules.
    ``on_tick`` is called once a second (``attnbench cancel``, the driver's status file); it
    stops the run, as Ctrl-C does, by raising :class:`~attnbench.dispatch.loop.Stop`.
    ``run_class``: :class:`SweepRun` (default) or :class:`attnbench.dispatch.lanes.LaneRun`."""
    run = (run_class or SweepRun)(store, conn, Progress(0, len(store.done), stream, quiet),
                                  worker_wait_s)
    run.on_tick = on_tick
    return run.run()


class SweepRun(RunLoop):
    """The ``tasks`` dispatch of :class:`~attnbench.dispatch.loop.RunLoop`: a Dask task per
    case. :meth:`hand_out` keeps a bounded window in flight, :meth:`step` turns finished
    futures into records (:meth:`collect`), :meth:`look_at_workers` gives up on cases that wait
    for a worker that left, :meth:`stop` cancels what is in flight after an interrupt."""

    def __init__(self, store: RunStore, conn: Connection, progress: Progress,
                 worker_wait_s: float = 60.0):
        super().__init__(store, conn, progress, worker_wait_s)
        self.held: dict[str, float] = {}  # case id -> since when it waits for workers that left

    # -- the strategy ----------------------------------------------------------------------------
    def work_left(self) -> bool:
        return bool(self.todo or self.in_flight)

    def stop(self) -> None:
        if not self.summary.interrupted:
            return
        for flight in self.in_flight.values():  # they stay pending
            flight.cancelled = True
            flight.future.cancel()

    def queued(self) -> int:
        return len(self.todo)

    def step(self, wait_s: float) -> None:
        """Every future finished by now, in one batch: their results are fetched from the
        workers in one ``gather`` (one round trip, not one per case: at 256 simulated GPUs
        the per-case ``result()`` held the driver to 27 cases/s, benchmarks/scale_simulation.py),
        then written, then synced to disk once."""
        try:
            batch = [self.done.get(timeout=wait_s)]
        except queue_mod.Empty:
            return
        while True:
            try:
                batch.append(self.done.get_nowait())
            except queue_mod.Empty:
                break
        results = self._gather(batch)
        for fut in batch:
            self.collect(fut, results.get(fut.key, _NOT_GATHERED))

    def _gather(self, batch: list) -> dict:
        """Results of the batch's finished futures by key; {} when they must be asked one by
        one (a failed or lost result among them; a client without ``gather``)."""
        gather = getattr(self.conn.client, "gather", None)
        if len(batch) < 2 or gather is None:
            return {}
        ready = [f for f in batch if f.key in self.in_flight
                 and not self.in_flight[f.key].cancelled and f.status == "finished"]
        if len(ready) < 2:
            return {}
        try:
            return {f.key: value for f, value in zip(ready, gather(ready))}
        except Exception:  # noqa: BLE001 -- each future is asked alone, which says what failed
            return {}

    # -- the steps -----------------------------------------------------------------------------
    def limit(self) -> int:
        return max(2, 2 * sum(w.devices for w in self.workers))

    def hand_out(self) -> None:
        """Submit more cases, up to a bounded window in flight."""
        parked, batch = [], []
        while self.todo and len(self.in_flight) + len(batch) < self.limit():
            case = self.todo.pop()
            resources, reason = plan_case(case, self.workers)
            if resources is None:
                if plan_case(case, self.seen.values())[0] is not None:  # they may come back
                    self.held.setdefault(case.id, time.monotonic())
                    parked.append(case)
                    continue
                self.skip(case, reason)
                continue
            self.held.pop(case.id, None)
            batch.append((case, resources))
        self.todo.extend(reversed(parked))
        for resources, cases in _by_resources(batch):
            for case, fut in zip(cases, self._submit(cases, resources)):
                self.in_flight[fut.key] = _Flight(case, fut)
                self.summary.submitted += 1
                fut.add_done_callback(self.done.put)

    def _submit(self, cases: list[Case], resources: dict) -> list:
        """Cases that ask for the same resources, as one graph (``client.map``: per case,
        ``client.submit`` cost 4.5 ms of the driver's time at 256 simulated GPUs)."""
        client = self.conn.client
        keys = [f"case-{c.id}-{time.monotonic_ns()}" for c in cases]
        args = ([c.to_dict() for c in cases], [self.options] * len(cases),
                [self.attempt(c) for c in cases], [resources[DEVICE]] * len(cases))
        if len(cases) > 1 and hasattr(client, "map"):
            return client.map(run_case_task_text, *args, key=keys, resources=resources, pure=False)
        return [client.submit(run_case_task_text, *one, resources=resources, key=key, pure=False)
                for key, one in zip(keys, zip(*args))]

    def collect(self, fut, gathered=_NOT_GATHERED) -> None:
        """``gathered``: the future's result, fetched with others (else it is asked here)."""
        from distributed.client import FutureCancelledError

        flight = self.in_flight.pop(fut.key, None)
        if flight is None or flight.cancelled:
            return
        try:
            record = fut.result() if gathered is _NOT_GATHERED else gathered
        except FutureCancelledError as exc:
            if exc.reason == "scheduler-connection-lost":
                raise self.scheduler_lost(len(self.in_flight) + 1) from None
            self.summary.not_run += 1
            self.progress.note(f"case {flight.case.id[:10]} was cancelled from outside "
                               f"({exc.reason}); it stays pending")
            return
        except Exception as exc:  # the task itself failed: KilledWorker, lease timeout, ...
            record = make_record(flight.case, verdict="lost",
                                 reason=f"{type(exc).__name__}: {str(exc)[:300]}",
                                 attempt=self.attempt(flight.case))
        self.accept(flight.case, record)

    def look_at_workers(self) -> None:
        self.refresh_workers()
        now = time.monotonic()
        for flight in list(self.in_flight.values()):
            self._check_stuck(flight, now)
        # From the few held cases, not the whole queue (100,000 cases at scale).
        expired = {i for i, since in self.held.items() if now - since > self.worker_wait_s}
        if expired:
            self.todo = [c for c in self.todo if c.id not in expired]
            for case_id in expired:
                self.held.pop(case_id)
            self.summary.not_run += len(expired)

    def _check_stuck(self, flight: _Flight, now: float) -> None:
        """A case in flight whose workers all left waits ``worker_wait_s``, then is cancelled
        (it stays pending)."""
        if plan_case(flight.case, self.workers)[0] is not None:
            flight.stuck_since = None
            return
        if flight.stuck_since is None:
            flight.stuck_since = now
            why = plan_case(flight.case, self.seen.values())[1] or "its worker left"
            self.progress.note(f"case {flight.case.id[:10]} waits for a worker: {why}; giving "
                               f"up after {self.worker_wait_s:g} s")
        elif now - flight.stuck_since > self.worker_wait_s:
            flight.cancelled = True
            flight.future.cancel()
            self.in_flight.pop(flight.future.key, None)
            self.summary.not_run += 1
