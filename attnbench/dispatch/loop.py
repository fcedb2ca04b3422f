"""The run loop both dispatches share: one skeleton (:class:`RunLoop`), two strategies.

A strategy says how cases are handed out, the skeleton does the rest, the same for both:
:meth:`RunLoop.run` plans (cases no worker can run are recorded ``skipped`` now), then ::

    start()                           hand out the first cases
    while work_left():
        step(wait_s)                  take what finished: journal it, update the progress line
        every TICK_S: look_at_workers(), then the on_tick hook (cancel, the status file)
        hand_out()                    hand out more: keep the workers busy
        store.flush()                 the batch's records, one write for them all
    stop()                            cancel or close what is still out (also after Ctrl-C or
                                      a lost scheduler)
    finish()                          the summary

The strategies: :class:`attnbench.dispatch.run.SweepRun` (``tasks``: one Dask task per case,
a bounded window in flight) and :class:`attnbench.dispatch.lanes.LaneRun` (``lanes``: one long
task per device pulling cases from the driver). What every result goes through on its way
into the journal (checked, written once, counted, shown) is here too, so both keep the
journal by the same rules (:mod:`attnbench.dispatch.run`'s docstring).
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
from attnbench.cluster.task import COMPILE_TOPIC
from attnbench.dispatch.eta import CaseTimes
from attnbench.errors import ClusterError, printable
from attnbench.results.records import BAD_VERDICTS, make_record
from attnbench.results.schema import check_record
from attnbench.results.store import RunStore
from attnbench.sweep.case import Case

log = logging.getLogger("attnbench")

TICK_S = 1.0
"""How often the client looks at the workers (joins, departures, stuck cases)."""

HEARTBEAT_S = 10.0
"""Without a new record, the progress line is printed again this often (a log, driver.log)."""
HEARTBEAT_TTY_S = 1.0
"""... and redrawn this often on a terminal (its elapsed seconds tick)."""

SHOWN_LIVE = 10
"""Failing cases printed as they arrive; the rest are counted at the end of the loop. A broken
kernel fails tens of cases: the first few say it is broken, the run's summary says what they
share (:mod:`attnbench.report.read.commonality`) and lists a few more."""


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
    shown: frozenset = frozenset()
    """Ids of the failing cases printed as they came (at most :data:`SHOWN_LIVE`): the run's
    summary does not list them again."""

    @property
    def lost(self) -> int:
        return self.counts["lost"]


class Progress:
    """One status line (rewritten on a terminal, printed every few seconds otherwise); the first
    :data:`SHOWN_LIVE` failing cases get a line of their own as they arrive (their ids kept in
    ``shown``), the rest a count when the loop ends (:meth:`finish`), unless ``quiet`` (the
    selftest, whose mutant cases fail on purpose)."""

    def __init__(self, total: int, already: int, stream: Optional[TextIO] = None,
                 quiet: bool = False):
        stream = stream or sys.stderr  # the one at call time (a default binds it at import)
        self.total, self.already, self.stream, self.quiet = total, already, stream, quiet
        self.done = 0
        self.counts: collections.Counter = collections.Counter()
        """This run's verdicts (the driver's status file says them as its own)."""
        self.before: collections.Counter = collections.Counter()
        """The verdicts the run directory held for the cases this run does not run again: the
        line counts what the run directory holds (a resumed run read ``[24/24] pass 12``)."""
        self.start = time.perf_counter()
        self.tty = stream.isatty()
        self.last_print = 0.0
        self.shown: set[str] = set()
        """Ids of the failing cases printed (at most SHOWN_LIVE)."""
        self.unshown = 0
        """Failing cases not printed: counted by :meth:`finish`."""
        self.times = CaseTimes()
        """Measured case seconds per (backend, GPU kind): the ETA (:mod:`~.eta`)."""
        self.slots = 1
        """Devices over the workers (cases that run at once), set as the workers are seen."""

    def eta_s(self) -> Optional[float]:
        """Seconds left from measured case times (None: no case measured yet)."""
        return self.times.eta_s(self.slots)

    def update(self, record: dict) -> None:
        self.done += 1
        self.counts[record["verdict"]] += 1
        self.times.finished(record)
        if record["verdict"] in BAD_VERDICTS and not self.quiet:
            if len(self.shown) < SHOWN_LIVE:
                self.shown.add(record["id"])
                self._clear()
                print(printable(f"  {record['verdict'].upper():8s} {record['id'][:10]} "
                                f"{record['label']}: {record['reason']}", 2000),
                      file=self.stream)
            else:
                self.unshown += 1
        now = time.perf_counter()
        # A terminal is redrawn at most 10 times a second: at hundreds of records a second a
        # redraw per record would cost the driver more than writing the records.
        if now - self.last_print > (0.1 if self.tty else 5) or self.done == self.total:
            self.last_print = now
            self._line()

    def finish(self) -> None:
        """The loop ended: count the failing cases not printed."""
        if self.unshown:
            self._clear()
            print(f"  ... and {self.unshown} more failure{'s' if self.unshown != 1 else ''} "
                  "(the summary lists more and what they share)", file=self.stream, flush=True)

    def note(self, text: str) -> None:
        self._clear()
        print(f"attnbench: {printable(text, 2000)}", file=self.stream, flush=True)

    def heartbeat(self, running: str = "") -> None:
        """Once a tick: the line again when nothing was printed for a while, so a run whose
        first cases compile for minutes is never silent (a FlexAttention sweep printed nothing
        for 134 s). ``running``: what is in flight, said after the line."""
        now = time.perf_counter()
        if self.done < self.total and now - self.last_print >= (
                HEARTBEAT_TTY_S if self.tty else HEARTBEAT_S):
            self.last_print = now
            self._line(running)

    def _clear(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K")

    def _line(self, running: str = "") -> None:
        elapsed = time.perf_counter() - self.start
        eta = self.eta_s()
        parts = " ".join(f"{v} {n}" for v, n in sorted((self.before + self.counts).items()))
        text = (f"[{self.done + self.already}/{self.total + self.already}] "
                f"{parts + '  ' if parts else ''}{elapsed:.0f}s elapsed, ETA "
                f"{'?' if eta is None else f'{eta:.0f}s'}"
                + (f"; {printable(running, 300)}" if running else ""))
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


class Stop(KeyboardInterrupt):
    """Raised by an ``on_tick`` hook: stop as on Ctrl-C (cases in flight stay pending)."""


def quiet_reconnects() -> None:
    """A lost cluster: the run reports it once; Dask's reconnect attempts would repeat it."""
    for name in ("distributed.client", "distributed.batched", "distributed.core"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


@dataclass
class _Flight:
    case: Case
    future: object
    stuck_since: Optional[float] = None
    cancelled: bool = False
    since: float = field(default_factory=time.monotonic)
    """When it was handed out (a task: submitted; a lane: sent to its device)."""
    compiling: Optional[float] = None
    """Since when its worker says it compiles (None: not compiling)."""


def _interleave_by_kind(cases: list[Case]) -> list[Case]:
    """Round-robin over GPU kinds (order kept within a kind), so a bounded window of cases in
    flight keeps every kind's workers busy."""
    by_kind: dict[str, list[Case]] = {}
    for case in cases:
        by_kind.setdefault(case.gpu, []).append(case)
    mixed = itertools.chain.from_iterable(itertools.zip_longest(*by_kind.values()))
    return [c for c in mixed if c is not None]


def checked_record(case: Case, record, attempt: int) -> tuple[dict, Optional[str]]:
    """A worker's answer for ``case`` (a record, or its JSON text) as the journal will hold it,
    and its JSON text: what it cannot hold (not JSON, another case, NaN, a foreign shape)
    becomes an ``error`` record saying why, so it never stops a run."""
    if isinstance(record, str):  # run_case_task_text
        try:
            record = json.loads(record)
        except ValueError as exc:
            record = make_record(case, verdict="error", attempt=attempt,
                                 reason=f"the worker's record is not JSON: {exc}"[:400])
    if not isinstance(record, dict) or record.get("id") != case.id:
        got = record.get("id") if isinstance(record, dict) else type(record).__name__
        env = (record.get("env") if isinstance(record, dict) else None) or {}
        record = make_record(case, verdict="error", reason=(
            f"the worker returned a record for case {got!r}: does it run another attnbench "
            f"version ({env.get('attnbench') if isinstance(env, dict) else '?'})?"),
            attempt=attempt)
    try:
        check_record("", record)
        record["id"] = case.id  # equal; the case's own string: the ledger's key shares it
        return record, json.dumps(record, separators=(",", ":"), allow_nan=False)
    except (ValueError, TypeError) as exc:
        return make_record(case, verdict="error", attempt=attempt, reason=(
            f"the worker's record cannot be stored: {exc}"[:400])), None


class RunLoop:
    """One pass over a run directory's pending cases: :meth:`run` is the skeleton (see the
    module docstring); a dispatch subclasses it and fills in :meth:`start`, :meth:`step`,
    :meth:`hand_out`, :meth:`work_left`, :meth:`look_at_workers`, :meth:`stop` and
    :meth:`queued`. The journal side is shared: :meth:`plan` (cases no worker can run are
    skipped now), :meth:`accept` (a worker's answer, checked), :meth:`write` (append it, once),
    :meth:`skip`, :meth:`refresh_workers` and :meth:`finish` (the summary)."""

    def __init__(self, store: RunStore, conn: Connection, progress: Progress,
                 worker_wait_s: float = 60.0):
        self.store, self.conn, self.progress = store, conn, progress
        self.worker_wait_s = worker_wait_s
        self.cases = list({c.id: c for c in store.pending()}.values())  # listed twice: run once
        self.before = {c.id: entry for c in self.cases
                       if (entry := store.done.get(c.id)) is not None}
        """The ledger entry, when the run began, of each case to run that had one (absent:
        none; most cases of a large sweep): another entry is a duplicate. Sparse, as every
        per-case table of the driver: a dense one cost ~100 B a case (10^6 cases, issue 29)."""
        self.summary = RunSummary(cases=len(self.cases))
        progress.total = len(self.cases)
        # What the journal already holds of this sweep and is not run again (recorded, and not
        # among the cases to run: those with a record are in ``before``), counted once.
        progress.before = collections.Counter(
            store.done[c.id].verdict for c in store.sweep.cases
            if c.id in store.done and c.id not in self.before)
        progress.already = sum(progress.before.values())
        self.options = store.sweep.options.to_dict()
        self.todo: list[Case] = []  # next case last: pop() from the end
        self.in_flight: dict[str, _Flight] = {}
        self.done: queue_mod.Queue = queue_mod.Queue()
        self.skip_reasons: set[str] = set()
        self.interrupts = _Interrupts()
        self.workers: list[WorkerInfo] = conn.workers()
        self.seen: dict[str, WorkerInfo] = {w.address: w for w in self.workers}
        self.on_tick: Optional[Callable[["RunLoop"], None]] = None
        progress.times.plan(self.cases)
        progress.slots = max(1, sum(w.devices for w in self.workers))
        self.compile_news: queue_mod.SimpleQueue = queue_mod.SimpleQueue()
        """What workers said of compiles (Dask events on :data:`COMPILE_TOPIC`)."""

    # -- the skeleton ----------------------------------------------------------------------------
    def run(self) -> RunSummary:
        t0 = time.perf_counter()
        next_look = time.monotonic() + TICK_S
        with self.interrupts.installed():
            try:
                self.listen_for_compiles()
                self.plan()
                self.start()
                if self.work_left():
                    self.progress.heartbeat(self.running_text())  # the first line, at once
                while self.work_left():
                    self.step(max(0.0, next_look - time.monotonic()))
                    if time.monotonic() >= next_look:
                        self.look_at_workers()
                        self.read_compile_news()
                        self.progress.heartbeat(self.running_text())
                        if self.on_tick is not None:
                            self.on_tick(self)
                        next_look = time.monotonic() + TICK_S
                    self.hand_out()
                    self.store.flush()  # the batch's records, one write for them all
            except KeyboardInterrupt:
                self.summary.interrupted = True
            except ClusterError:
                quiet_reconnects()
                raise
            finally:
                self.stop()
                self.store.flush()
                self.stop_listening()
        return self.finish(t0)

    # -- what a dispatch fills in ------------------------------------------------------------
    def start(self) -> None:
        """Hand out the first cases (:meth:`plan` has filled ``todo``)."""
        self.hand_out()

    def step(self, wait_s: float) -> None:
        """Take what finished within ``wait_s`` seconds into the journal."""
        raise NotImplementedError

    def hand_out(self) -> None:
        """Hand out more cases, as far as the workers have room."""
        raise NotImplementedError

    def work_left(self) -> bool:
        """Cases queued, out on the cluster, or finished but not yet taken."""
        raise NotImplementedError

    def look_at_workers(self) -> None:
        """Once a tick: joins, departures, cases that wait for a worker that left."""
        raise NotImplementedError

    def stop(self) -> None:
        """The loop ended (done, interrupted, or the scheduler was lost): cancel or close what
        is still out; the cases it holds stay pending."""

    def queued(self) -> int:
        """Cases not yet handed to a worker."""
        raise NotImplementedError

    # -- what is running: compiles and the progress line ---------------------------------------
    def listen_for_compiles(self) -> None:
        """Subscribe to the workers' compile news (a client without events: none come)."""
        subscribe = getattr(self.conn.client, "subscribe_topic", None)
        if subscribe is None:
            return
        try:
            subscribe(COMPILE_TOPIC, lambda event: self.compile_news.put(event))
        except Exception:  # noqa: BLE001 -- a nicety: the run goes on without it
            log.debug("no compile news from the workers", exc_info=True)

    def stop_listening(self) -> None:
        unsubscribe = getattr(self.conn.client, "unsubscribe_topic", None)
        if unsubscribe is not None and getattr(self.conn.client, "status", "") == "running":
            with contextlib.suppress(Exception):  # a closing client: nothing left to hear
                unsubscribe(COMPILE_TOPIC)

    def read_compile_news(self) -> None:
        """Say when a case starts compiling (once per case). Events come from any client of a
        shared scheduler: only a case of this run in flight is believed, and only its id and a
        flag are read."""
        news = []
        while True:
            try:
                news.append(self.compile_news.get_nowait())
            except queue_mod.Empty:
                break
        if not news:
            return
        flights = {f.case.id: f for f in list(self.in_flight.values())}
        for event in news:
            msg = event[1] if isinstance(event, tuple) and len(event) == 2 else event
            if not isinstance(msg, dict) or not isinstance(msg.get("case"), str):
                continue
            flight = flights.get(msg["case"])
            if flight is None:
                continue
            if msg.get("start") is True and flight.compiling is None:
                flight.compiling = time.monotonic()
                self.progress.note(f"compiling {flight.case.id[:10]} {flight.case.label} "
                                   f"({flight.case.backend}: its first call compiles; the "
                                   "case's timeout waits for it)")
            elif msg.get("start") is False:
                flight.compiling = None

    def running_text(self) -> str:
        """What the progress line says of the cases in flight: how many, and the longest."""
        flights = list(self.in_flight.values())
        if not flights:
            return ""
        oldest = min(flights, key=lambda f: f.since)
        now = time.monotonic()
        what = (f"compiling for {now - oldest.compiling:.0f} s" if oldest.compiling is not None
                else f"for {now - oldest.since:.0f} s")
        return (f"{len(flights)} running, the longest {oldest.case.id[:10]} "
                f"{oldest.case.label} {what}")

    # -- the journal side (both dispatches) ------------------------------------------------------
    def finish(self, t0: float) -> RunSummary:
        """The summary of a run loop that started at ``t0``."""
        if self.summary.not_run:
            self.progress.note(f"{self.summary.not_run} cases not run (no worker left that can "
                               "run them); they stay pending")
        self.progress.finish()
        self.summary.shown = frozenset(self.progress.shown)
        self.summary.wall_s = time.perf_counter() - t0
        return self.summary

    def plan(self) -> None:
        """Everything no worker can run is reported now, not when its turn comes."""
        for case in _interleave_by_kind(self.cases):
            resources, reason = plan_case(case, self.workers)
            if resources is None:
                self.skip(case, reason)
            else:
                self.todo.append(case)
        self.todo.reverse()

    def accept(self, case: Case, record) -> None:
        """A worker's answer for ``case`` (a record, or its JSON text), checked, then written."""
        self.write(*checked_record(case, record, self.attempt(case)))

    def attempt(self, case: Case) -> int:
        """The attempt number of this run's record of ``case`` (1, or its last record's + 1)."""
        entry = self.before.get(case.id)
        return 1 if entry is None else entry.attempt + 1

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
                               attempt=self.attempt(case)))

    def scheduler_lost(self, in_flight_count: int) -> ClusterError:
        return ClusterError(f"lost the connection to the Dask scheduler ({self.conn.where}); "
                            f"{self.summary.written} records written by this run, "
                            f"{in_flight_count} cases in flight not recorded")

    def refresh_workers(self) -> None:
        try:
            if self.conn.client.status not in ("running", "newly-created"):
                raise OSError(f"client status {self.conn.client.status}")
            workers = self.conn.workers()
        except OSError:  # CommClosedError and timeouts included
            raise self.scheduler_lost(len(self.in_flight)) from None
        keeper = getattr(self.conn, "keeper", None)
        if keeper is not None:  # the embedded cluster: its worker that left is replaced
            note = keeper.check(workers, self.summary.written)
            if note:
                self.progress.note(note)
            if keeper.restarting:
                return  # its cases wait for the new one, not for the worker that left
        self.workers = workers
        self.seen.update((w.address, w) for w in self.workers)
        self.progress.slots = max(1, sum(w.devices for w in self.workers))
