"""The client side of a run: submit pending cases, stream records into the journal.

The journal is the truth (the Dask scheduler persists nothing). Rules that keep it exact:

* At most ``2 x devices`` cases are in flight, so a large sweep does not flood the scheduler and
  an interruption loses only those (they stay pending; the next run of the same sweep does
  them).
* Records are appended the moment they arrive; a case id already in the journal is never
  written again (``duplicated`` counts such arrivals).
* A case no connected worker can satisfy (GPU kind missing, too few devices on one worker) is
  recorded ``skipped`` with the reason before it is submitted: in Dask it would wait in
  ``no-worker`` forever. One whose workers left during the run (they were seen) is held for
  ``worker_wait_s`` in case they come back, then left pending, unrecorded.
* A worker that dies mid-case: Dask reruns its cases elsewhere; after ``allowed-failures``
  (default 3) deaths a case ends in KilledWorker and is recorded ``lost``.
* Ctrl-C or SIGTERM: in-flight cases are cancelled and stay pending; a record being written is
  finished first. Losing the scheduler raises :class:`~attnbench.cluster.ClusterError` with one
  line; nothing in flight is recorded.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import queue as queue_mod
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, Optional, TextIO

from attnbench.cluster import ClusterError, Connection, WorkerInfo, plan_case, run_case_task
from attnbench.records import BAD_VERDICTS, make_record
from attnbench.spec import Case
from attnbench.store import RunStore
from attnbench.worker import DEVICE

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
    cases get a line of their own as they arrive."""

    def __init__(self, total: int, already: int, stream: TextIO = sys.stderr):
        self.total, self.already, self.stream = total, already, stream
        self.done = 0
        self.counts: collections.Counter = collections.Counter()
        self.start = time.perf_counter()
        self.tty = stream.isatty()
        self.last_print = 0.0

    def update(self, record: dict) -> None:
        self.done += 1
        self.counts[record["verdict"]] += 1
        if record["verdict"] in BAD_VERDICTS:
            self._clear()
            print(f"  {record['verdict'].upper():8s} {record['id'][:10]} {record['label']}: "
                  f"{record['reason']}", file=self.stream)
        now = time.perf_counter()
        if self.tty or now - self.last_print > 5 or self.done == self.total:
            self.last_print = now
            self._line()

    def note(self, text: str) -> None:
        self._clear()
        print(f"attnbench: {text}", file=self.stream, flush=True)

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


def _interleave_by_kind(cases: list[Case]) -> list[Case]:
    """Round-robin over GPU kinds (order kept within a kind), so a bounded window of cases in
    flight keeps every kind's workers busy."""
    by_kind: dict[str, list[Case]] = {}
    for case in cases:
        by_kind.setdefault(case.gpu, []).append(case)
    mixed = itertools.chain.from_iterable(itertools.zip_longest(*by_kind.values()))
    return [c for c in mixed if c is not None]


def run_pending(store: RunStore, conn: Connection, stream: TextIO = sys.stderr, *,
                worker_wait_s: float = 60.0) -> RunSummary:
    """Run the store's pending cases on ``conn``; see the module docstring for the rules."""
    from distributed.client import FutureCancelledError

    cases = list({c.id: c for c in store.pending()}.values())  # a case listed twice runs once
    summary = RunSummary(cases=len(cases))
    progress = Progress(len(cases), len(store.done), stream)
    options = store.sweep.options.to_dict()
    todo: list[Case] = []  # next case last: pop() from the end
    held: dict[str, float] = {}  # case id -> since when it waits for workers that left
    in_flight: dict[str, _Flight] = {}
    done: queue_mod.Queue = queue_mod.Queue()
    skip_reasons: set[str] = set()
    interrupts = _Interrupts()
    t0 = time.perf_counter()

    workers: list[WorkerInfo] = conn.workers()
    seen: dict[str, WorkerInfo] = {w.address: w for w in workers}
    next_look = time.monotonic() + TICK_S

    def write(record: dict) -> None:
        if record["id"] in store.done:
            summary.duplicated += 1
            log.warning("a second result for case %s arrived; the journal keeps the first",
                        record["id"])
            return
        with interrupts.deferred():
            store.append(record)
        summary.written += 1
        summary.counts[record["verdict"]] += 1
        summary.inside_s += record.get("duration_s") or 0.0
        progress.update(record)

    def skip(case: Case, reason: str) -> None:
        if reason not in skip_reasons:
            skip_reasons.add(reason)
            progress.note(f"skipping cases no worker can run: {reason}")
        write(make_record(case, verdict="skipped", reason=reason))

    def limit() -> int:
        return max(2, 2 * sum(w.devices for w in workers))

    def submit_more() -> None:
        parked = []
        while todo and len(in_flight) < limit():
            case = todo.pop()
            resources, reason = plan_case(case, workers)
            if resources is None:
                if plan_case(case, seen.values())[0] is not None:  # its workers may come back
                    held.setdefault(case.id, time.monotonic())
                    parked.append(case)
                    continue
                skip(case, reason)
                continue
            held.pop(case.id, None)
            fut = conn.client.submit(run_case_task, case.to_dict(), options, 1,
                                     resources[DEVICE], resources=resources,
                                     key=f"case-{case.id}-{time.monotonic_ns()}", pure=False)
            in_flight[fut.key] = _Flight(case, fut)
            summary.submitted += 1
            fut.add_done_callback(done.put)
        todo.extend(reversed(parked))

    def collect(fut) -> None:
        flight = in_flight.pop(fut.key, None)
        if flight is None or flight.cancelled:
            return
        try:
            record = fut.result()
        except FutureCancelledError as exc:
            if exc.reason == "scheduler-connection-lost":
                raise scheduler_lost(len(in_flight) + 1) from None
            summary.not_run += 1
            progress.note(f"case {flight.case.id[:10]} was cancelled from outside "
                          f"({exc.reason}); it stays pending")
            return
        except Exception as exc:  # the task itself failed: KilledWorker, lease timeout, ...
            record = make_record(flight.case, verdict="lost",
                                 reason=f"{type(exc).__name__}: {str(exc)[:300]}")
        if record.get("id") != flight.case.id:
            record = make_record(flight.case, verdict="error", reason=(
                f"the worker returned a record for case {record.get('id')!r}: does it run "
                f"another attnbench version ({(record.get('env') or {}).get('attnbench')})?"))
        write(record)

    def scheduler_lost(in_flight_count: int) -> ClusterError:
        return ClusterError(f"lost the connection to the Dask scheduler ({conn.where}); "
                            f"{summary.written} records written by this run, "
                            f"{in_flight_count} cases in flight not recorded")

    def look_at_workers() -> None:
        nonlocal workers
        try:
            if conn.client.status not in ("running", "newly-created"):
                raise OSError(f"client status {conn.client.status}")
            workers = conn.workers()
        except OSError:  # CommClosedError and timeouts included
            raise scheduler_lost(len(in_flight)) from None
        seen.update((w.address, w) for w in workers)
        now = time.monotonic()
        for flight in list(in_flight.values()):
            if plan_case(flight.case, workers)[0] is not None:
                flight.stuck_since = None
                continue
            if flight.stuck_since is None:
                flight.stuck_since = now
                progress.note(f"case {flight.case.id[:10]} waits for a worker: "
                              f"{plan_case(flight.case, seen.values())[1] or 'its worker left'}"
                              f"; giving up after {worker_wait_s:g} s")
            elif now - flight.stuck_since > worker_wait_s:
                flight.cancelled = True
                flight.future.cancel()
                in_flight.pop(flight.future.key, None)
                summary.not_run += 1
        for case in [c for c in todo if c.id in held and now - held[c.id] > worker_wait_s]:
            todo.remove(case)
            held.pop(case.id)
            summary.not_run += 1

    with interrupts.installed():
        try:
            # Everything no worker can run is reported now, not when its turn comes.
            for case in _interleave_by_kind(cases):
                resources, reason = plan_case(case, workers)
                if resources is None:
                    skip(case, reason)
                else:
                    todo.append(case)
            todo.reverse()
            submit_more()
            while todo or in_flight:
                try:
                    fut = done.get(timeout=max(0.0, next_look - time.monotonic()))
                except queue_mod.Empty:
                    fut = None
                while fut is not None:
                    collect(fut)
                    try:
                        fut = done.get_nowait()
                    except queue_mod.Empty:
                        fut = None
                if time.monotonic() >= next_look:
                    look_at_workers()
                    next_look = time.monotonic() + TICK_S
                submit_more()
        except KeyboardInterrupt:
            summary.interrupted = True
            for flight in in_flight.values():
                flight.cancelled = True
                flight.future.cancel()
        except ClusterError:
            for name in ("distributed.client", "distributed.batched", "distributed.core"):
                logging.getLogger(name).setLevel(logging.CRITICAL)  # no reconnect noise
            raise
    if summary.not_run:
        progress.note(f"{summary.not_run} cases not run (no worker left that can run them); "
                      "they stay pending")
    summary.wall_s = time.perf_counter() - t0
    return summary
