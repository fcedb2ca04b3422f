"""Lanes: a worker pulls its next case from the driver itself (``--dispatch lanes``).

With one Dask task per case (:class:`attnbench.dispatch.run.SweepRun`) every case costs a task's
bookkeeping in the scheduler, the worker and the client, and a freed device waits for the
scheduler to hand it its next case: at 256 simulated GPUs with 1 s cases that held a 2-core box
to ~130 cases/s with ~40 % of GPU time idle (benchmarks/scale_simulation.py). Here the driver
submits one long-lived Dask task per device and kind of case (a *lane*, pinned to one worker
and holding the case's Dask resources, so Dask still accounts for the devices), and each lane
asks the driver over one connection for a case at a time: ``{"lane", "done": [records]}`` ->
``{"cases": [[case, attempt]]}``; an empty answer ends the lane. The case itself runs exactly as
a task would (:func:`attnbench.cluster.task.run_case_task`: device lease, warm rank pool, crash
isolation), so only the dispatch changes.

Rules that keep the journal exact: the driver knows which case each lane connection holds (at
most one); a record is taken only from the connection holding its case. When a connection
closes while holding a case (its worker was killed or left), the case goes back to the front
of its queue, and after ``allowed-failures`` such deaths (Dask's setting, default 3) it is
recorded ``lost``, as a task would be with KilledWorker. A lane whose worker left is
cancelled; one whose worker is gone but whose connection stays open is cut after
``worker_wait_s``. Ctrl-C: lanes are told to stop; the cases they hold stay pending.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import logging
import os
import queue as queue_mod
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

from attnbench.cluster.connect import plan_case
from attnbench.cluster.task import run_case_task_text
from attnbench.dispatch.loop import Progress, RunLoop, _Flight
from attnbench.dispatch.run import SweepRun
from attnbench.resources import DEVICE
from attnbench.results.records import make_record
from attnbench.sweep.case import Case

log = logging.getLogger("attnbench")

DISPATCHES = ("tasks", "lanes")
LANE_FAILURES = 3
"""Lane tasks of one worker that may fail in a row (cannot reach the driver, cannot import
attnbench) before the driver puts no more lanes there."""


# -- the worker side -----------------------------------------------------------------------------


async def _ask(comm, message: dict) -> dict:
    await comm.write(message)
    return await comm.read()


def lane_task(address: str, lane: str, options_dict: dict, devices: int) -> int:
    """Dask task: ask the driver at ``address`` for cases until it has none, run each one as
    :func:`run_case_task` would, send back its record with the next request. Returns how many
    cases it ran. A worker that closes under a case (its plugin's teardown kills the rank pools)
    sends nothing for it: the connection closes and the driver puts the case back."""
    from distributed import get_worker
    from distributed.comm import CommClosedError, connect
    from distributed.utils import sync

    from attnbench.cluster.plugin import worker_state

    worker = get_worker()
    state = worker_state()  # the lease table and rank pools the cases use
    try:
        comm = sync(worker.loop, connect, address, **worker.connection_args)
    except (OSError, TimeoutError) as exc:
        raise ConnectionError(f"lane on {worker.address} cannot reach the driver at {address}: "
                              f"{exc}") from None
    done: list[str] = []
    ran = 0
    try:
        while True:
            try:
                reply = sync(worker.loop, _ask, comm, {"lane": lane, "done": done})
            except (CommClosedError, OSError):
                return ran  # the driver stopped: what this lane held stays pending
            cases = reply.get("cases") or []
            if not cases:
                return ran
            done = [_run_one(case_dict, attempt, options_dict, devices)
                    for case_dict, attempt in cases]
            if state.closed:  # what ran was cut short by the worker closing, not the case
                return ran
            ran += len(done)
    finally:
        with contextlib.suppress(Exception):
            sync(worker.loop, comm.close)


def _run_one(case_dict: dict, attempt: int, options_dict: dict, devices: int) -> str:
    try:
        return run_case_task_text(case_dict, options_dict, attempt, devices)
    except Exception as exc:  # noqa: BLE001 -- a lease timeout: as the task path records it
        return json.dumps(make_record(Case.from_dict(case_dict), verdict="lost", attempt=attempt,
                                      reason=f"{type(exc).__name__}: {str(exc)[:300]}"))


# -- the driver side -----------------------------------------------------------------------------


@dataclass
class _Lane:
    key: str
    group: tuple
    worker: str
    devices: int
    future: object = None
    comm: object = None


@dataclass
class _Held:
    """What one lane connection holds (read and written under the run's lock)."""
    lane: Optional[str] = None
    worker: str = ""
    cases: list = field(default_factory=list)


def _listen_address(client) -> str:
    """Where lanes reach the driver: this host's address towards the scheduler."""
    from distributed.comm.addressing import get_address_host, parse_address, unparse_host_port
    from distributed.utils import get_ip

    scheme, _ = parse_address(client.scheduler.address)
    host = get_address_host(client.scheduler.address)
    local = host if host in ("127.0.0.1", "localhost", "::1") else get_ip(host)
    return f"{scheme}://{unparse_host_port(local, 0)}"


class LaneRun(RunLoop):
    """The ``lanes`` dispatch of :class:`~attnbench.dispatch.loop.RunLoop` (see the module
    docstring): :meth:`start` queues the cases by the resources they need and listens for the
    lanes, :meth:`hand_out` starts lanes, :meth:`step` takes what the connections hand in,
    :meth:`stop` tells the lanes to stop."""

    def __init__(self, *args, **kwargs):
        import dask

        super().__init__(*args, **kwargs)
        self.lock = threading.Lock()
        self.queues: dict[tuple, collections.deque] = {}
        self.resources: dict[tuple, dict] = {}
        self.group_of: dict[str, tuple] = {}
        self.lanes: dict[str, _Lane] = {}
        self.deaths: dict[str, set[str]] = collections.defaultdict(set)  # case -> workers
        self.failures: collections.Counter = collections.Counter()  # worker -> failed in a row
        self.held_groups: dict[tuple, float] = {}
        self.orphans: dict[str, tuple[float, _Lane]] = {}  # lanes whose worker left, since
        self.stopping = False
        self.comms: set = set()
        self.listener = None
        self.address = ""
        self.allowed_failures = int(dask.config.get("distributed.scheduler.allowed-failures", 3))
        self.tag = f"{os.getpid()}-{time.monotonic_ns()}"
        self.counter = itertools.count()

    def queued(self) -> int:
        return sum(len(q) for q in self.queues.values())

    # -- the strategy ----------------------------------------------------------------------------
    def start(self) -> None:
        self._queue_todo()
        self._listen()
        self.hand_out()

    def work_left(self) -> bool:
        # Under the lock: a connection that closes moves its case from in_flight back to a
        # queue in one step, never seen half done.
        with self.lock:
            return bool(self.queued() or self.in_flight or not self.done.empty())

    def _queue_todo(self) -> None:
        for case in reversed(self.todo):  # todo: next case last
            resources, _ = plan_case(case, self.workers)
            group = tuple(sorted(resources.items()))
            self.resources[group] = resources
            self.group_of[case.id] = group
            self.queues.setdefault(group, collections.deque()).append(case)
        self.todo = []

    def step(self, wait_s: float) -> None:
        """Records, lost cases and ended lanes, as the connections and futures left them."""
        try:
            batch = [self.done.get(timeout=wait_s)]
        except queue_mod.Empty:
            return
        while not self.done.empty():
            batch.append(self.done.get_nowait())
        for what, subject, detail in batch:
            if what == "record":
                self.accept(subject, detail)
            elif what == "lost":
                self.write(make_record(subject, verdict="lost", reason=detail,
                                       attempt=self.attempts[subject.id]))
            else:
                self._lane_ended(subject)

    # -- the connection to the lanes (on the client's event loop) ------------------------------
    def _listen(self) -> None:
        from distributed.comm import listen

        client = self.conn.client
        security = getattr(client, "security", None)
        args = security.get_listen_args("client") if security is not None else {}

        async def start():
            listener = listen(_listen_address(client), self._serve, **args)
            await listener.start()
            return listener

        self.listener = client.sync(start)
        self.address = self.listener.contact_address

    async def _serve(self, comm) -> None:
        from distributed.comm import CommClosedError

        held = _Held()
        self.comms.add(comm)
        try:
            while True:
                message = await comm.read()
                await comm.write(self._answer(message, held, comm))
        except (CommClosedError, OSError):
            pass  # the lane ended, its worker died, or the run stopped
        finally:
            self.comms.discard(comm)
            self._release(held)

    def _answer(self, message: dict, held: _Held, comm) -> dict:
        with self.lock:
            held.lane = message.get("lane")
            for text in message.get("done") or ():
                if held.cases:
                    self.done.put(("record", held.cases.pop(0), text))
            self.in_flight.pop(held.lane, None)
            lane = self.lanes.get(held.lane)
            queue = self.queues.get(lane.group) if lane is not None else None
            if self.stopping or not queue:
                return {"cases": []}
            lane.comm = comm
            held.worker = lane.worker
            case = queue.popleft()
            held.cases.append(case)
            self.in_flight[held.lane] = _Flight(case, lane.future)
            return {"cases": [[case.to_dict(), self.attempts[case.id]]]}

    def _release(self, held: _Held) -> None:
        """A connection closed: what it held goes back to the front of its queue (pending, if
        the run is stopping); a case whose lanes died under it too often is ``lost``."""
        with self.lock:
            if held.cases:
                self.in_flight.pop(held.lane, None)
            if not held.cases or self.stopping:
                return
            first = held.cases[0]
            # Counted once per worker, as Dask does: a killed worker's other lanes may still
            # have sent a request, be handed the case again and close at once.
            self.deaths[first.id].add(held.worker)
            back = held.cases
            if len(self.deaths[first.id]) >= self.allowed_failures:
                self.done.put(("lost", first, (
                    f"KilledWorker: {len(self.deaths[first.id])} workers died while running it "
                    f"(last: {held.worker})")))
                back = held.cases[1:]
            self.queues[self.group_of[first.id]].extendleft(reversed(back))
            held.cases = []

    # -- lanes -----------------------------------------------------------------------------------
    def hand_out(self) -> None:
        """Top up: on each worker, one lane per free device (or block of devices) for a group
        of cases that has more queued cases than idle lanes."""
        with self.lock:
            used: collections.Counter = collections.Counter()
            lanes_of: collections.Counter = collections.Counter()
            for lane in self.lanes.values():
                used[lane.worker] += lane.devices
                lanes_of[lane.group] += 1
            busy = collections.Counter(self.lanes[k].group for k in self.in_flight
                                       if k in self.lanes)
            room = {g: len(q) - (lanes_of[g] - busy[g]) for g, q in self.queues.items() if q}
        plan: dict[tuple, list[str]] = {}
        for worker in sorted(self.workers, key=lambda w: w.name):
            if self.failures[worker.address] >= LANE_FAILURES:
                continue
            free = worker.devices - used[worker.address]
            for group, wanted in room.items():
                need = int(self.resources[group].get(DEVICE, 1))
                if wanted <= 0 or free < need or not worker.offers(self.resources[group]):
                    continue
                count = min(wanted, free // need)
                plan[(worker.address, group)] = [f"lane-{self.tag}-{next(self.counter)}"
                                                 for _ in range(count)]
                room[group] -= count
                free -= count * need
        for (address, group), keys in plan.items():
            self._submit_lanes(address, group, keys)

    def _submit_lanes(self, address: str, group: tuple, keys: list[str]) -> None:
        resources = self.resources[group]
        devices = int(resources.get(DEVICE, 1))
        n = len(keys)
        with self.lock:
            for key in keys:
                self.lanes[key] = _Lane(key, group, address, devices)
        futures = self.conn.client.map(
            lane_task, [self.address] * n, keys, [self.options] * n, [devices] * n, key=keys,
            resources=resources, workers=[address], allow_other_workers=False, pure=False)
        for future in futures:
            self.lanes[future.key].future = future
            future.add_done_callback(lambda f: self.done.put(("ended", f, None)))

    def _lane_ended(self, future) -> None:
        with self.lock:
            lane = self.lanes.pop(future.key, None)
        if lane is None or self.stopping or future.status != "error":
            if lane is not None and future.status == "finished":
                self.failures[lane.worker] = 0
            return
        self.failures[lane.worker] += 1
        if self.failures[lane.worker] == LANE_FAILURES:
            exc = future.exception()
            self.progress.note(f"worker {lane.worker}: its lanes failed {LANE_FAILURES} times "
                               f"in a row ({type(exc).__name__}: {str(exc)[:200]}); no more "
                               "cases go there")
        with self.lock:
            starved = [g for g, q in self.queues.items() if q and not any(
                self.failures[w.address] < LANE_FAILURES and w.offers(self.resources[g])
                for w in self.workers)]
            cases = [c for g in starved for c in self.queues[g]]
            for g in starved:
                self.queues[g].clear()
        exc = future.exception()
        for case in cases:  # no worker left that runs lanes for them: as a failed task would be
            self.write(make_record(case, verdict="lost", attempt=self.attempts[case.id],
                                   reason=f"{type(exc).__name__}: {str(exc)[:300]}"))

    def look_at_workers(self) -> None:
        self.refresh_workers()
        alive = {w.address for w in self.workers}
        now = time.monotonic()
        with self.lock:
            gone = [lane for lane in self.lanes.values()
                    if lane.worker not in alive and lane.key not in self.orphans]
            for lane in gone:
                self.orphans[lane.key] = (now, lane)
            for key, (since, lane) in list(self.orphans.items()):
                if key not in self.in_flight:
                    del self.orphans[key]
                elif now - since > self.worker_wait_s and lane.comm is not None:
                    # Its worker left but the connection stays open (a partition): cutting it
                    # puts the case back in the queue.
                    self.conn.client.loop.add_callback(lane.comm.abort)
                    del self.orphans[key]
        cancel = [lane.future for lane in gone if lane.future is not None]
        if cancel:
            with contextlib.suppress(Exception):
                self.conn.client.cancel(cancel)
        for group, queue in self.queues.items():
            if not queue or any(w.offers(self.resources[group]) for w in self.workers):
                self.held_groups.pop(group, None)
                continue
            since = self.held_groups.setdefault(group, now)
            if since == now:
                why = plan_case(queue[0], self.seen.values())[1] or "their workers left"
                self.progress.note(f"{len(queue)} cases wait for a worker: {why}; giving up "
                                   f"after {self.worker_wait_s:g} s")
            elif now - since > self.worker_wait_s:
                with self.lock:
                    self.summary.not_run += len(queue)
                    queue.clear()

    def stop(self) -> None:
        """Tell the lanes to stop (what they hold stays pending) and close the connections."""
        with self.lock:
            self.stopping = True
            futures = [lane.future for lane in self.lanes.values() if lane.future is not None]
        if self.listener is None:
            return

        async def close():
            self.listener.stop()
            for comm in list(self.comms):
                comm.abort()

        with contextlib.suppress(Exception):
            if futures and self.conn.client.status == "running":
                self.conn.client.cancel(futures)
            self.conn.client.sync(close)


def run_class(dispatch: str) -> type:
    """The run loop for ``dispatch``: ``tasks`` (a Dask task per case) or ``lanes``."""
    if dispatch not in DISPATCHES:
        raise ValueError(f"dispatch: got {dispatch!r}, expected one of {', '.join(DISPATCHES)}")
    return LaneRun if dispatch == "lanes" else SweepRun


def make_run(store, conn, progress: Progress, worker_wait_s: float = 60.0,
             dispatch: str = "tasks") -> RunLoop:
    return run_class(dispatch)(store, conn, progress, worker_wait_s)
