"""Lanes: a worker pulls its next case from the driver itself (``--dispatch lanes``).

With one Dask task per case (:class:`attnbench.dispatch.run.SweepRun`) every case costs a task's
bookkeeping in the scheduler, the worker and the client, and a freed device waits for the
scheduler to hand it its next case: at 256 simulated GPUs with 1 s cases that held a 2-core box
to ~130 cases/s with ~40 % of GPU time idle (benchmarks/scale_simulation.py). Here the driver
submits one long-lived Dask task per device and kind of case (a *lane*, pinned to one worker
and holding the case's Dask resources, so Dask still accounts for the devices), and each lane
asks the driver over one connection for a case at a time, handing in the record of the last
one (:mod:`~.lane_wire`: plain JSON, authenticated per run); no case ends the lane. The case
itself runs exactly as a task would (:func:`attnbench.cluster.task.run_case_task`: device
lease, warm rank pool, crash isolation), so only the dispatch changes.

Who may talk to the driver: the lanes it launched, each once. A lane's key is derived from a
secret this driver drew for this run and holds in memory only; it reaches the lane's worker
through the driver's own Dask client (``client.run`` to that worker, just before the lane is
submitted), never as a task argument, and is taken from the worker's memory by the lane as it
starts. The key itself never crosses the lane connection (challenge and response, both ways).

Rules that keep the journal exact: a lane connection holds at most one case, under a lease id;
a record is taken only from the connection holding that lease, only for its case, and only if
the journal can hold it (:func:`_check_lane_record`); anything else is refused and closes the
connection. When a connection closes while holding a case (its worker was killed or left, or
it was refused), the case goes back to the front of its queue, and after ``allowed-failures``
such deaths or refusals (Dask's setting, default 3) it is recorded ``lost``, as a task would
be with KilledWorker. A lane that finds the driver's port full (strangers holding it) tries
again, then ends as :class:`~.lane_wire.LaneBusy`: no failure of its worker, its cases stay
queued and the driver says why (issue 41, item 3). A lane whose worker left is cancelled; one
whose worker is gone but whose connection stays open is cut after ``worker_wait_s``. Ctrl-C:
lanes are told to stop; the cases they hold stay pending.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import logging
import queue as queue_mod
import random
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Optional

from attnbench.cluster.connect import plan_case
from attnbench.cluster.task import run_case_task_text
from attnbench.dispatch.lane_server import LaneConn, LaneServer
from attnbench.dispatch.lane_wire import (LEASE_HEX, MAX_RECORD, LaneBusy, LaneChannel,
                                          LaneProtocolError, lane_key, new_secret)
from attnbench.dispatch.loop import Progress, RunLoop, _Flight, checked_record
from attnbench.dispatch.run import SweepRun
from attnbench.errors import ClusterError, printable
from attnbench.resources import DEVICE, DISPATCHES
from attnbench.results.records import make_record
from attnbench.results.schema import check_record
from attnbench.sweep.case import Case

log = logging.getLogger("attnbench")

LANE_FAILURES = 3
"""Lane tasks of one worker that may fail in a row (cannot reach the driver, cannot import
attnbench) before the driver puts no more lanes there."""


# -- the worker side -----------------------------------------------------------------------------

CONNECT_WAIT_S = 30.0
"""A lane's connection and handshake to its driver (what :data:`~.lane_server.HANDSHAKE_S`
allows on the driver's side)."""
ANSWER_WAIT_S = 300.0
"""The driver answers a request at once (a queue pop under a lock); 300 s is far beyond a
loaded driver's pauses, and frees the worker thread of a lane whose driver vanished without
closing its connection (a partition)."""
BUSY_WAIT_S = 300.0
"""How long a lane keeps trying a driver whose port is full before it ends (as
:class:`LaneBusy`, and the driver starts another): strangers holding the port delay the run,
they do not fail its workers."""
BUSY_PAUSE_S = (0.1, 5.0)
"""A lane's first and longest pause between tries on a full port (doubling, jittered)."""
KEYS_KEPT = 4096
"""Lane keys a worker keeps for lanes that have not started (one per device each hand-out; a
lane cancelled before it ran leaves its key behind): the oldest go first."""

_keys: collections.OrderedDict = collections.OrderedDict()
_keys_lock = threading.Lock()


def _deposit_keys(keys: dict[str, str]) -> None:
    """Run by the driver's client on a lane's worker (``client.run``) just before it submits
    the lanes: their keys, kept in this worker process until each lane takes its own."""
    with _keys_lock:
        for lane, key in keys.items():
            _keys[lane] = bytes.fromhex(key)
        while len(_keys) > KEYS_KEPT:
            _keys.popitem(last=False)


def _take_key(lane: str) -> Optional[bytes]:
    with _keys_lock:
        return _keys.pop(lane, None)


def lane_task(address: str, lane: str, options_dict: dict, devices: int, run: str) -> int:
    """Dask task: ask the driver at ``address`` for cases until it has none, run each one as
    :func:`run_case_task` would, hand its record in with the next request (:mod:`~.lane_wire`).
    Returns how many cases it ran. A worker that closes under a case (its plugin's teardown
    kills the rank pools) sends nothing for it: the connection closes and the driver puts the
    case back."""
    from distributed import get_worker

    from attnbench.cluster.plugin import worker_state

    worker = get_worker()
    state = worker_state()  # the lease table and rank pools the cases use
    key = _take_key(lane)
    if key is None:
        raise ConnectionError(f"lane {lane} on {worker.address}: the driver handed this worker "
                              "no key for it (did the worker restart since?)")
    tls = worker.security.get_connection_args("worker").get("ssl_context")
    try:
        channel = _open_when_room(address, run, lane, key, tls)
    except LaneBusy as exc:
        raise LaneBusy(f"lane on {worker.address}: the driver's lane port at {address} stayed "
                       f"full for {BUSY_WAIT_S:g} s ({exc})") from None
    except (OSError, LaneProtocolError) as exc:
        raise ConnectionError(f"lane on {worker.address} cannot reach the driver at {address}: "
                              f"{exc}") from None
    done: Optional[dict] = None
    ran = 0
    try:
        while True:
            try:
                answer = channel.ask({"done": done}, ANSWER_WAIT_S)
            except OSError:
                return ran  # the driver stopped: what this lane held stays pending
            except LaneProtocolError as exc:
                # The driver refused what it handed in (and counts it against the case): one
                # line in the worker's log, not a failed task's traceback (issue #25, item 12).
                log.warning("attnbench lane %s on %s: %s", lane, worker.address, exc)
                return ran
            if answer is None:
                return ran
            text = _run_one(answer, options_dict, devices)
            if state.closed:  # what ran was cut short by the worker closing, not the case
                return ran
            done = {"lease": answer["lease"], "record": text}
            ran += 1
    finally:
        channel.close()


def _open_when_room(address: str, run: str, lane: str, key: bytes, tls) -> LaneChannel:
    """:meth:`LaneChannel.open`, tried again while the driver's port is full (its key is not
    spent until its proof is taken), for up to :data:`BUSY_WAIT_S`."""
    deadline = time.monotonic() + BUSY_WAIT_S
    pause, longest = BUSY_PAUSE_S
    while True:
        try:
            return LaneChannel.open(address, run, lane, key, tls, CONNECT_WAIT_S)
        except LaneBusy:
            if time.monotonic() + pause > deadline:
                raise
        time.sleep(pause * random.uniform(0.5, 1.0))  # jittered: lanes do not come back as one
        pause = min(2 * pause, longest)


def _run_one(answer: dict, options_dict: dict, devices: int) -> str:
    """The record of the case in ``answer``, as JSON text the driver will take: checked as the
    journal checks it (what it cannot hold becomes an ``error`` record, here)."""
    case_dict, attempt = answer["case"], answer["attempt"]
    case = Case.from_dict(case_dict)
    try:
        text = run_case_task_text(case_dict, options_dict, attempt, devices)
    except Exception as exc:  # noqa: BLE001 -- a lease timeout: as the task path records it
        text = json.dumps(make_record(case, verdict="lost", attempt=attempt,
                                      reason=f"{type(exc).__name__}: {str(exc)[:300]}"))
    record, text = checked_record(case, text, attempt)
    text = text or json.dumps(record, separators=(",", ":"))
    if len(text) > MAX_RECORD:  # ASCII: json.dumps escapes the rest
        text = json.dumps(make_record(case, verdict="error", attempt=attempt, reason=(
            f"its record is {len(text)} bytes, over the {MAX_RECORD} a lane may hand in")))
    return text


# -- the driver side -----------------------------------------------------------------------------


@dataclass
class _Lane:
    key: str
    group: tuple
    worker: str
    devices: int
    future: object = None
    conn: Optional[LaneConn] = None
    connected: bool = False
    """A lane connects once: a second connection on its key is refused, live or not."""


def _listen_host(client) -> str:
    """Where lanes reach the driver: loopback for a scheduler on loopback, else this host's
    address towards the scheduler (the workers' lanes must reach it)."""
    from distributed.comm.addressing import get_address_host
    from distributed.utils import get_ip

    host = get_address_host(client.scheduler.address)
    return host if host in ("127.0.0.1", "localhost", "::1") else get_ip(host)


def _listen_tls(client):
    """The listener's TLS context when the cluster speaks TLS (None otherwise), from the first
    role that has a certificate: the client's for ``run``, the worker's for a driver that runs
    in a worker (``submit``), whose client has none (issue #25, item 3)."""
    from distributed.comm.addressing import parse_address

    security = getattr(client, "security", None)
    if security is None or not (parse_address(client.scheduler.address)[0] == "tls"
                                or security.require_encryption):
        return None
    for role in ("client", "worker", "scheduler"):
        if security.get_tls_config_for_role(role).get("cert"):
            context = security.get_listen_args(role)["ssl_context"]
            if context is not None:
                return context
    raise ClusterError("the cluster speaks TLS but this driver has no certificate and CA for "
                       "the lanes' listener: give --tls-ca-file, --tls-cert and --tls-key, or "
                       "--dispatch tasks")


def _check_lane_record(case: Case, text: str) -> tuple[dict, str]:
    """A lane's record for ``case`` as the journal will hold it, or LaneProtocolError: JSON,
    the case's id and the same case in its body, every field as the schema says."""
    try:
        record = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise LaneProtocolError(f"a record that is not JSON ({type(exc).__name__})") from None
    got = record.get("id") if isinstance(record, dict) else type(record).__name__
    if got != case.id:
        raise LaneProtocolError(f"a record for case {printable(got, 80)!r}; its lease is for "
                                f"case {case.id}")
    try:
        check_record("", record)
        # The case it was handed, unchanged, is that case (3 us); anything else is rebuilt
        # and its id compared (53 us: the largest cost of a record's check).
        if record["case"] != case.to_dict() and Case.from_dict(record["case"]).id != case.id:
            raise ValueError("the case in its body is another case")
        record["id"] = case.id  # equal; the case's own string: the ledger's key shares it
        text = json.dumps(record, separators=(",", ":"), allow_nan=False)
    except (ValueError, TypeError, KeyError) as exc:
        raise LaneProtocolError(f"a record for case {case.id} the journal cannot hold: "
                                f"{printable(exc, 200)}") from None
    return record, text


def _refuse_constant(name: str):
    raise ValueError(f"{name} in a record")


class LaneRun(RunLoop):
    """The ``lanes`` dispatch of :class:`~attnbench.dispatch.loop.RunLoop` (see the module
    docstring): :meth:`start` queues the cases by the resources they need and listens for the
    lanes (:class:`~.lane_server.LaneServer`, which calls :meth:`lane_key`,
    :meth:`lane_connected`, :meth:`lane_request` and :meth:`lane_closed`), :meth:`hand_out`
    starts lanes, :meth:`step` takes what the connections hand in, :meth:`stop` tells the
    lanes to stop."""

    def __init__(self, *args, **kwargs):
        import dask

        super().__init__(*args, **kwargs)
        self.lock = threading.Lock()
        self.queues: dict[tuple, collections.deque] = {}
        self.resources: dict[tuple, dict] = {}
        self.lanes: dict[str, _Lane] = {}
        self.deaths: dict[str, set[str]] = collections.defaultdict(set)  # case -> workers
        self.refusals: collections.Counter = collections.Counter()  # case -> refused hand-ins
        self.failures: collections.Counter = collections.Counter()  # worker -> failed in a row
        self.held_groups: dict[tuple, float] = {}
        self.orphans: dict[str, tuple[float, _Lane]] = {}  # lanes whose worker left, since
        self.stopping = False
        self.server: Optional[LaneServer] = None
        self.address = ""
        self.allowed_failures = int(dask.config.get("distributed.scheduler.allowed-failures", 3))
        self.secret = new_secret()  # this run's only: never written, never sent
        self.tag = secrets.token_hex(6)
        self.counter = itertools.count()
        self.busy_noted, self.busy_noted_at = 0, float("-inf")  # full-port refusals told
        self.busy_lanes = 0  # lanes that ended on a full port
        self.room_may_grow = True
        """Set by what can free a device or queue a case again (a lane ended or closed, a lane
        failed, a tick's look at the workers): :meth:`hand_out` plans only then. Planning
        after every batch of records walked every lane and worker: 0.5 ms a record at 288
        GPUs, the driver's largest cost (``scale_simulation.py --profile``)."""

    def queued(self) -> int:
        return sum(len(q) for q in self.queues.values())

    # -- the strategy ----------------------------------------------------------------------------
    def start(self) -> None:
        self._queue_todo()
        self._listen()
        self.hand_out()

    def work_left(self) -> bool:
        # Under the lock: a connection that closes moves its case from in_flight back to a
        # queue in one step, never seen half done. A case queued is work left whatever else
        # holds: that answer needs no lock (the listener holds it for every request).
        if self.queued():
            return True
        with self.lock:
            return bool(self.queued() or self.in_flight or not self.done.empty())

    def _queue_todo(self) -> None:
        for case in reversed(self.todo):  # todo: next case last
            resources, _ = plan_case(case, self.workers)
            group = tuple(sorted(resources.items()))
            self.resources[group] = resources
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
            if what == "record":  # checked by _check_lane_record: (record, its JSON text)
                self.write(*detail)
            elif what == "lost":
                self.write(make_record(subject, verdict="lost", reason=detail,
                                       attempt=self.attempt(subject)))
            else:
                self._lane_ended(subject)

    # -- the connections (called by the listener, on its thread) -------------------------------
    def _listen(self) -> None:
        client = self.conn.client
        self.server = LaneServer(self, _listen_host(client), _listen_tls(client), self.tag)
        self.address = self.server.start()

    def lane_key(self, lane_id: str) -> bytes:
        with self.lock:
            lane = self.lanes.get(lane_id)
            if lane is None:
                raise LaneProtocolError(f"{lane_id} is not a lane of this run")
        return lane_key(self.secret, self.tag, lane_id)

    def lane_connected(self, conn: LaneConn, lane_id: str) -> None:
        """``conn`` proved it holds ``lane_id``'s key: the lane's one connection."""
        with self.lock:
            lane = self.lanes.get(lane_id)
            if lane is None or lane.connected:
                raise LaneProtocolError(f"{lane_id} has connected already")
            lane.connected, lane.conn, conn.lane = True, conn, lane

    def lane_request(self, conn: LaneConn, done: Optional[dict]) -> dict:
        """Take the record ``conn`` hands in (for the lease it holds, checked), then hand it
        its next case: one at a time, from its lane's queue."""
        lane = conn.lane
        checked = None
        if done is not None:
            if done["lease"] != conn.lease:
                raise LaneProtocolError(f"a record for lease {done['lease']}; it holds "
                                        f"{conn.lease or 'none'}")
            checked = _check_lane_record(conn.case, done["record"])
        elif conn.case is not None:
            raise LaneProtocolError(f"asked for a case while holding lease {conn.lease}")
        with self.lock:
            if checked is not None:
                self.done.put(("record", conn.case, checked))
                conn.case = conn.lease = None
            self.in_flight.pop(lane.key, None)
            queue = self.queues.get(lane.group)
            if self.stopping or not queue or lane.key not in self.lanes:
                return {"case": None}
            case = queue.popleft()
            conn.case, conn.lease = case, secrets.token_hex(LEASE_HEX // 2)
            self.in_flight[lane.key] = _Flight(case, lane.future)
            return {"case": case.to_dict(), "id": case.id, "attempt": self.attempt(case),
                    "lease": conn.lease}

    def lane_closed(self, conn: LaneConn) -> None:
        """A connection closed: the case it held goes back to the front of its queue (pending,
        if the run is stopping); one whose lanes died under it, or whose records the driver
        refused, ``allowed-failures`` times is ``lost``."""
        with self.lock:
            self.room_may_grow = True
            case, lane = conn.case, conn.lane
            conn.case = conn.lease = None
            if lane is None or case is None:
                return
            self.in_flight.pop(lane.key, None)
            if self.stopping:
                return
            if conn.refusal is not None:
                self.refusals[case.id] += 1
                count = self.refusals[case.id]
                reason = (f"the driver refused what its lanes handed in {count} times (last: "
                          f"worker {lane.worker}: {conn.refusal})")
            else:
                # Counted once per worker, as Dask does: a killed worker's other lanes may
                # still have sent a request, be handed the case again and close at once.
                self.deaths[case.id].add(lane.worker)
                count = len(self.deaths[case.id])
                reason = (f"KilledWorker: {count} workers died while running it (last: "
                          f"{lane.worker})")
            if count >= self.allowed_failures:
                self.done.put(("lost", case, reason))
            else:
                self.queues[lane.group].appendleft(case)  # the queue it was taken from

    # -- lanes -----------------------------------------------------------------------------------
    def hand_out(self) -> None:
        """Top up: on each worker, one lane per free device (or block of devices) for a group
        of cases that has more queued cases than idle lanes."""
        if not self.room_may_grow:  # read without the lock (the listener holds it for every
            return                  # request); a flag set after this read is seen next step
        with self.lock:
            self.room_may_grow = False
            used: collections.Counter = collections.Counter()
            lanes_of: collections.Counter = collections.Counter()
            for lane in self.lanes.values():
                used[lane.worker] += lane.devices
                lanes_of[lane.group] += 1
            busy = collections.Counter(self.lanes[k].group for k in self.in_flight
                                       if k in self.lanes)
            room = {g: len(q) - (lanes_of[g] - busy[g]) for g, q in self.queues.items() if q}
        plan: dict[str, dict[tuple, list[str]]] = {}
        for worker in sorted(self.workers, key=lambda w: w.name):
            if self.failures[worker.address] >= LANE_FAILURES:
                continue
            free = worker.devices - used[worker.address]
            for group, wanted in room.items():
                need = int(self.resources[group].get(DEVICE, 1))
                if wanted <= 0 or free < need or not worker.offers(self.resources[group]):
                    continue
                count = min(wanted, free // need)
                plan.setdefault(worker.address, {})[group] = [
                    f"lane-{self.tag}-{next(self.counter)}" for _ in range(count)]
                room[group] -= count
                free -= count * need
        for address, groups in plan.items():
            if self._hand_keys(address, [k for keys in groups.values() for k in keys]):
                for group, keys in groups.items():
                    self._submit_lanes(address, group, keys)

    def _hand_keys(self, address: str, keys: list[str]) -> bool:
        """Give ``address``'s worker the keys of its new lanes through this run's own Dask
        client (``client.run`` to that worker alone): never a task argument, which the
        scheduler keeps for anyone who asks. False (a lane failure) if it cannot be done."""
        tickets = {k: lane_key(self.secret, self.tag, k).hex() for k in keys}
        try:
            self.conn.client.run(_deposit_keys, tickets, workers=[address])
        except Exception as exc:  # noqa: BLE001 -- its worker left, or cannot import attnbench
            self._lane_failed(address, exc)
            return False
        return True

    def _submit_lanes(self, address: str, group: tuple, keys: list[str]) -> None:
        resources = self.resources[group]
        devices = int(resources.get(DEVICE, 1))
        n = len(keys)
        with self.lock:
            for key in keys:
                self.lanes[key] = _Lane(key, group, address, devices)
        futures = self.conn.client.map(
            lane_task, [self.address] * n, keys, [self.options] * n, [devices] * n,
            [self.tag] * n, key=keys, resources=resources, workers=[address],
            allow_other_workers=False, pure=False)
        for future in futures:
            self.lanes[future.key].future = future
            future.add_done_callback(lambda f: self.done.put(("ended", f, None)))

    def _lane_ended(self, future) -> None:
        with self.lock:
            self.room_may_grow = True
            lane = self.lanes.pop(future.key, None)
        if lane is None or self.stopping or future.status != "error":
            if lane is not None and future.status == "finished":
                self.failures[lane.worker] = 0
            return
        exc = future.exception()
        if isinstance(exc, LaneBusy) and self.server is not None and self.server.busy:
            # Strangers hold the port: not the worker's failure. (Believed only if the port
            # was full: a TLS lane cut for another reason looks the same from its side.)
            self.busy_lanes += 1
            if self.busy_lanes == 1:  # the rest are counted in the note on the port
                self.progress.note(f"{printable(exc, 400)}; its cases stay queued, another "
                                   "lane takes its place")
            return
        self._lane_failed(lane.worker, exc)

    def _lane_failed(self, worker: str, exc: BaseException) -> None:
        """A lane of ``worker`` failed (or could not be started); after :data:`LANE_FAILURES` in
        a row no more go there, and cases no other worker can take are ``lost``."""
        self.failures[worker] += 1
        if self.failures[worker] == LANE_FAILURES:
            self.progress.note(f"worker {worker}: its lanes failed {LANE_FAILURES} times in a "
                               f"row ({type(exc).__name__}: {str(exc)[:200]}); no more cases "
                               "go there")
        with self.lock:
            self.room_may_grow = True  # the devices it was planned for are free again
            starved = [g for g, q in self.queues.items() if q and not any(
                self.failures[w.address] < LANE_FAILURES and w.offers(self.resources[g])
                for w in self.workers)]
            cases = [c for g in starved for c in self.queues[g]]
            for g in starved:
                self.queues[g].clear()
        for case in cases:  # no worker left that runs lanes for them: as a failed task would be
            self.write(make_record(case, verdict="lost", attempt=self.attempt(case),
                                   reason=f"{type(exc).__name__}: {str(exc)[:300]}"))

    def _note_busy(self) -> None:
        """Say that the lane port was full (a denial of service, seen from here), at most once
        a minute: the lanes try again and no case is lost for it."""
        busy, now = (self.server.busy if self.server else 0), time.monotonic()
        if busy > self.busy_noted and now - self.busy_noted_at >= 60:
            self.progress.note(f"the lanes' port was full: {busy} connections turned away or "
                               f"cut (first: {self.server.first_busy}), {self.busy_lanes} "
                               "lanes gave up; something holds it in handshakes; lanes try "
                               "again, their cases stay queued")
            self.busy_noted, self.busy_noted_at = busy, now

    def look_at_workers(self) -> None:
        self._note_busy()
        with self.lock:
            self.room_may_grow = True  # workers came or went; and a safety net, once a tick
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
                elif now - since > self.worker_wait_s and lane.conn is not None:
                    # Its worker left but the connection stays open (a partition): cutting it
                    # puts the case back in the queue.
                    self.server.abort(lane.conn)
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
        if self.server is None:
            return
        with contextlib.suppress(Exception):
            if futures and self.conn.client.status == "running":
                self.conn.client.cancel(futures)
        self.server.close()
        if self.server.refused:  # what was refused was neither run nor journaled
            self.progress.note(f"the lanes' listener refused {self.server.refused} "
                               f"connection{'s' if self.server.refused != 1 else ''} (first: "
                               f"{self.server.first_refusal})")


def run_class(dispatch: str) -> type:
    """The run loop for ``dispatch``: ``tasks`` (a Dask task per case) or ``lanes``."""
    if dispatch not in DISPATCHES:
        raise ValueError(f"dispatch: got {dispatch!r}, expected one of {', '.join(DISPATCHES)}")
    return LaneRun if dispatch == "lanes" else SweepRun


def make_run(store, conn, progress: Progress, worker_wait_s: float = 60.0,
             dispatch: str = "tasks") -> RunLoop:
    return run_class(dispatch)(store, conn, progress, worker_wait_s)
