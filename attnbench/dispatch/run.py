"""The client side of a run: submit pending cases, stream records into the journal.

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

import collections
import contextlib
import itertools
import json
import logging
import queue as queue_mod
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, TextIO

from attnbench.cluster.connect import Connection, WorkerInfo, plan_case
from attnbench.cluster.task import run_case_task_text
from attnbench.errors import ClusterError, printable
from attnbench.results.records import BAD_VERDICTS, make_record
from attnbench.sweep.case import Case
from attnbench.results.store import RunStore
from attnbench.results.schema import check_record
from attnbench.resources import DEVICE

log = logging.getLogger("attnbench")

TICK_S = 1.0
"""How often the client looks at the workers (joins, departures, stuck cases)."""


@dataclass
class RunSummary:
    cases: int = 0
    """Cases pending when the run started."""
    submitted: int = 0
    """Cases handed to Dask (Dask's own reruns after a worker died are not counted)."""
    written: int = 0
    """Records appended to the journal by this run."""
    counts: collections.Counter = field(default_factory=collections.Counter)
    """Verdicts of the records written."""
    duplicated: int = 0
    """Results that arrived for a case already in the journal (not written again)."""
    not_run: int = 0
    """Cases left pending: their workers left, or they were cancelled from outside."""
    wall_s: float = 0.0
    inside_s: float = 0.0
    """Sum of time spent inside rank processes on cases (accuracy + timing)."""
    interrupted: bool = False

    @property
    def lost(self) -> int:
        return self.counts["lost"]


class Progress:
    """One status line (rewritten on a terminal, printed every few seconds otherwise); failing
    cases get a line of their own as they arrive, unless ``quiet`` (the selftest, whose mutant
    cases fail on purpose)."""

    def __init__(self, total: int, already: int, stream: Optional[TextIO] = None,
                 quiet: bool = False):
        stream = stream or sys.stderr  # the one at call time (a default binds it at import)
        self.total, self.already, self.stream, self.quiet = total, already, stream, quiet
        self.done = 0
        self.counts: collections.Counter = collections.Counter()
        self.start = time.perf_counter()
        self.tty = stream.isatty()
        self.last_print = 0.0

    def update(self, record: dict) -> None:
        self.done += 1
        self.counts[record["verdict"]] += 1
        if record["verdict"] in BAD_VERDICTS and not self.quiet:
            self._clear()
            print(printable(f"  {record['verdict'].upper():8s} {record['id'][:10]} "
                            f"{record['label']}: {record['reason']}", 2000), file=self.stream)
        now = time.perf_counter()
        # A terminal is redrawn at most 10 times a second: at hundreds of records a second a
        # redraw per record would cost the driver more than writing the records.
        if now - self.last_print > (0.1 if self.tty else 5) or self.done == self.total:
            self.last_print = now
            self._line()

    def note(self, text: str) -> None:
        self._clear()
        print(f"attnbench: {printable(text, 2000)}", file=self.stream, flush=True)

    def _clear(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K")

    def _line(self) -> None:
        elapsed = time.perf_counter() - self.start
        rate = self.done / elapsed if elapsed > 0 else 0
        eta = (self.total - self.done) / rate if rate else 0
        parts = " ".join(f"{v} {n}" for v, n in sorted(self.counts.items()))
        text = (f"[{self.done + self.already}/{self.total + self.already}] {parts}  "
                f"{elapsed:.0f}s elapsed, ETA {eta:.0f}s")
        if self.tty:
            self.stream.write("\r\033[K" + text)
            if self.done == self.total:
                self.stream.write("\n")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


class _Interrupts:
    """SIGINT and SIGTERM become KeyboardInterrupt, but never in the middle of writing a record
    (the signal is then honoured right after it)."""

    def __init__(self) -> None:
        self.pending: Optional[str] = None
        self.critical = False

    def handler(self, signum: int, frame) -> None:
        self.pending = signal.Signals(signum).name
        if not self.critical:
            raise KeyboardInterrupt(self.pending)

    @contextlib.contextmanager
    def installed(self) -> Iterator["_Interrupts"]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        old = {s: signal.signal(s, self.handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        self.critical = True
        try:
            yield
        finally:
            self.critical = False
        if self.pending:
            raise KeyboardInterrupt(self.pending)


@dataclass
class _Flight:
    case: Case
    future: object
    stuck_since: Optional[float] = None
    cancelled: bool = False


_NOT_GATHERED = object()


def _by_resources(batch: list[tuple[Case, dict]]) -> list[tuple[dict, list[Case]]]:
    """Cases grouped by the resources they ask for, in order of first appearance."""
    groups: dict[tuple, tuple[dict, list[Case]]] = {}
    for case, resources in batch:
        groups.setdefault(tuple(sorted(resources.items())), (resources, []))[1].append(case)
    return list(groups.values())


def _interleave_by_kind(cases: list[Case]) -> list[Case]:
    """Round-robin over GPU kinds (order kept within a kind), so a bounded window of cases in
    flight keeps every kind's workers busy."""
    by_kind: dict[str, list[Case]] = {}
    for case in cases:
        by_kind.setdefault(case.gpu, []).append(case)
    mixed = itertools.chain.from_iterable(itertools.zip_longest(*by_kind.values()))
    return [c for c in mixed if c is not None]


def run_pending(store: RunStore, conn: Connection, stream: Optional[TextIO] = None, *,
                worker_wait_s: float = 60.0, quiet: bool = False,
                on_tick: Optional[Callable[["SweepRun"], None]] = None,
                run_class: Optional[type] = None) -> RunSummary:
    """Run the store's pending cases on ``conn``; see the module docstring for the rules.
    ``on_tick`` is called once a second (``attnbench cancel``, the driver's status file); it
    stops the run, as Ctrl-C does, by raising :class:`Stop`. ``run_class``: :class:`SweepRun`
    (default) or :class:`attnbench.dispatch.lanes.LaneRun`."""
    run = (run_class or SweepRun)(store, conn, Progress(0, len(store.done), stream, quiet),
                                  worker_wait_s)
    run.on_tick = on_tick
    return run.run()


class Stop(KeyboardInterrupt):
    """Raised by an ``on_tick`` hook: stop as on Ctrl-C (cases in flight stay pending)."""


def quiet_reconnects() -> None:
    """A lost cluster: the run reports it once; Dask's reconnect attempts would repeat it."""
    for name in ("distributed.client", "distributed.batched", "distributed.core"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


class SweepRun:
    """One pass over a run directory's pending cases. The steps: :meth:`plan` (cases no worker
    can run are skipped now), :meth:`submit_more` (keep a bounded window in flight),
    :meth:`collect` (a finished future becomes a record), :meth:`write` (append it, once),
    :meth:`look_at_workers` (joins, departures, cases that wait for a worker that left)."""

    def __init__(self, store: RunStore, conn: Connection, progress: Progress,
                 worker_wait_s: float = 60.0):
        self.store, self.conn, self.progress = store, conn, progress
        self.worker_wait_s = worker_wait_s
        self.cases = list({c.id: c for c in store.pending()}.values())  # listed twice: run once
        self.before = {c.id: store.done.get(c.id) for c in self.cases}
        """Each case's record when the run began (None: none): another is a duplicate."""
        self.attempts = {c.id: store.attempt(c) for c in self.cases}
        self.summary = RunSummary(cases=len(self.cases))
        progress.total = len(self.cases)
        self.options = store.sweep.options.to_dict()
        self.todo: list[Case] = []  # next case last: pop() from the end
        self.held: dict[str, float] = {}  # case id -> since when it waits for workers that left
        self.in_flight: dict[str, _Flight] = {}
        self.done: queue_mod.Queue = queue_mod.Queue()
        self.skip_reasons: set[str] = set()
        self.interrupts = _Interrupts()
        self.workers: list[WorkerInfo] = conn.workers()
        self.seen: dict[str, WorkerInfo] = {w.address: w for w in self.workers}
        self.on_tick: Optional[Callable[["SweepRun"], None]] = None

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> RunSummary:
        t0 = time.perf_counter()
        next_look = time.monotonic() + TICK_S
        with self.interrupts.installed():
            try:
                self.plan()
                self.submit_more()
                while self.todo or self.in_flight:
                    self._collect_finished(max(0.0, next_look - time.monotonic()))
                    if time.monotonic() >= next_look:
                        self.look_at_workers()
                        if self.on_tick is not None:
                            self.on_tick(self)
                        next_look = time.monotonic() + TICK_S
                    self.submit_more()
                    self.store.flush()  # the batch's records, one write for them all
            except KeyboardInterrupt:
                self.summary.interrupted = True
                for flight in self.in_flight.values():
                    flight.cancelled = True
                    flight.future.cancel()
            except ClusterError:
                quiet_reconnects()
                raise
            finally:
                self.store.flush()
        return self.finish(t0)

    def finish(self, t0: float) -> RunSummary:
        """The summary of a run loop that started at ``t0`` (either dispatch)."""
        if self.summary.not_run:
            self.progress.note(f"{self.summary.not_run} cases not run (no worker left that can "
                               "run them); they stay pending")
        self.summary.wall_s = time.perf_counter() - t0
        return self.summary

    def _collect_finished(self, wait_s: float) -> None:
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
    def plan(self) -> None:
        """Everything no worker can run is reported now, not when its turn comes."""
        for case in _interleave_by_kind(self.cases):
            resources, reason = plan_case(case, self.workers)
            if resources is None:
                self.skip(case, reason)
            else:
                self.todo.append(case)
        self.todo.reverse()

    def queued(self) -> int:
        """Cases not yet handed to a worker."""
        return len(self.todo)

    def limit(self) -> int:
        return max(2, 2 * sum(w.devices for w in self.workers))

    def submit_more(self) -> None:
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
                [self.attempts[c.id] for c in cases], [resources[DEVICE]] * len(cases))
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
                                 attempt=self.attempts[flight.case.id])
        self.accept(flight.case, record)

    def accept(self, case: Case, record) -> None:
        """A worker's answer for ``case`` (a record, or its JSON text), checked, then written."""
        flight = _Flight(case, None)
        if isinstance(record, str):  # run_case_task_text
            try:
                record = json.loads(record)
            except ValueError as exc:
                record = make_record(flight.case, verdict="error", attempt=self.attempts[
                    flight.case.id], reason=f"the worker's record is not JSON: {exc}"[:400])
        if not isinstance(record, dict) or record.get("id") != flight.case.id:
            got = record.get("id") if isinstance(record, dict) else type(record).__name__
            env = (record.get("env") if isinstance(record, dict) else None) or {}
            record = make_record(flight.case, verdict="error", reason=(
                f"the worker returned a record for case {got!r}: does it run another attnbench "
                f"version ({env.get('attnbench') if isinstance(env, dict) else '?'})?"),
                attempt=self.attempts[flight.case.id])
        text = None
        try:  # what the journal cannot hold (NaN, a foreign shape) must not stop the run
            check_record("", record)
            text = json.dumps(record, separators=(",", ":"), allow_nan=False)
        except (ValueError, TypeError) as exc:
            record = make_record(flight.case, verdict="error", attempt=self.attempts[
                flight.case.id], reason=f"the worker's record cannot be stored: {exc}"[:400])
        self.write(record, text)

    def write(self, record: dict, text: Optional[str] = None) -> None:
        """Append ``record`` (``text``: its JSON) once; the run loop flushes each batch."""
        if self.store.done.get(record["id"]) is not self.before.get(record["id"]):
            self.summary.duplicated += 1
            log.warning("a second result for case %s arrived; the journal keeps the first",
                        record["id"])
            return
        with self.interrupts.deferred():
            # Counted with the append: an interrupt honoured right after it must not leave the
            # summary one record short of the journal.
            note = self.store.append(record, text=text, flush=False)
            self.summary.written += 1
            self.summary.counts[record["verdict"]] += 1
            self.summary.inside_s += record.get("duration_s") or 0.0
        if note:
            self.progress.note(note)
        self.progress.update(record)

    def skip(self, case: Case, reason: str) -> None:
        if reason not in self.skip_reasons:
            self.skip_reasons.add(reason)
            self.progress.note(f"skipping cases no worker can run: {reason}")
        self.write(make_record(case, verdict="skipped", reason=reason,
                               attempt=self.attempts[case.id]))

    def scheduler_lost(self, in_flight_count: int) -> ClusterError:
        return ClusterError(f"lost the connection to the Dask scheduler ({self.conn.where}); "
                            f"{self.summary.written} records written by this run, "
                            f"{in_flight_count} cases in flight not recorded")

    def refresh_workers(self) -> None:
        try:
            if self.conn.client.status not in ("running", "newly-created"):
                raise OSError(f"client status {self.conn.client.status}")
            self.workers = self.conn.workers()
        except OSError:  # CommClosedError and timeouts included
            raise self.scheduler_lost(len(self.in_flight)) from None
        self.seen.update((w.address, w) for w in self.workers)

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
