"""The embedded cluster keeps its worker: when it leaves, a new one starts and the run goes on.

On the embedded LocalCluster of ``attnbench run`` nothing else can run the cases, so a worker
that left must come back. Its nanny restarts a worker process that died, but three paths end
with no worker at all, each seen here on loopback (distributed 2026.8):

* the restart is slower than ``distributed.deploy.lost-worker-timeout`` (15 s): the
  LocalCluster then closes the nanny that is still restarting its worker, and drops it;
* the worker closes itself (its stream to the scheduler broke, the scheduler no longer knew
  it): ``Worker.close`` closes its nanny too, which then restarts nothing;
* the nanny fails to start a new process (``nanny-instantiate-failed``) and closes.

In each the LocalCluster starts no new worker (it does only when scaled), and the run, which
waited ``--worker-wait`` for a worker that "left", gave up with the cases pending (issue #25
item 13: 476 of 1,585 at load 8-13 on 2 cores). :class:`WorkerKeeper`, asked once a tick by
the run loop, replaces every dead nanny with a new one (under a new name, so the cluster's
pending "lost worker" timer cannot close the new one) and says so in one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Iterable, Optional

START_S = 120.0
"""A nanny whose worker has not registered this long after it left is stuck, not slow: it is
closed and replaced. A restart took 0.5-0.6 s on this 2-core box at load 4 (a cold cluster
2.6 s); 120 s leaves a factor of 40 for a box at load 13 or a worker on a slow filesystem."""
RESTARTS = 3
"""Restarts in a row without a record written in between before the keeper gives up (the
cases then wait ``--worker-wait`` and stay pending): a worker that dies three times without
finishing a case is broken, not unlucky (Dask's ``allowed-failures`` default, 3)."""


class WorkerKeeper:
    """Keeps ``expected`` workers on a LocalCluster (``cluster``, reached with ``client``).

    :meth:`check` is called once a tick with the workers the scheduler has; while
    :attr:`restarting` is true a worker is on its way back, and the run keeps its cases for it
    instead of counting them as waiting for a worker that left."""

    def __init__(self, cluster, client) -> None:
        self.cluster, self.client = cluster, client
        self.expected = len(cluster.worker_spec)
        self.restarting = False
        self.gave_up = False
        self.since = 0.0
        self.in_a_row = 0
        self.written_at_restart = 0
        self.last_seen: list[str] = []

    def check(self, workers: Iterable, written: int) -> Optional[str]:
        """``workers``: what the scheduler has now (WorkerInfo); ``written``: records written by
        the run so far. Returns one line for the user when something happened, else None."""
        addresses = [w.address for w in workers]
        now = time.monotonic()
        if len(addresses) >= self.expected:
            # Its nanny may have brought it back between two looks (a lanes driver can be busy
            # for a while): a new address where the old one was is a departure all the same.
            came_back = (not self.restarting and self.last_seen
                         and not set(self.last_seen) & set(addresses))
            why = self._why() if came_back else ""
            self.last_seen, self.restarting = addresses, False
            if written > self.written_at_restart:
                self.in_a_row = 0  # it finished a case since the last restart: not broken
            if came_back:
                return f"the embedded Dask worker left ({why}); its nanny started a new one, " \
                       "the run goes on"
            return None
        if self.gave_up:
            return None
        if not self.restarting:  # a new departure
            why = self._why()
            if self.in_a_row >= RESTARTS:
                return self._give_up(why)
            self.in_a_row += 1
            self.restarting, self.since, self.written_at_restart = True, now, written
            self.cluster.sync(self._replace_dead, stuck=False)
            return f"the embedded Dask worker left ({why}); starting a new one, the run goes on"
        if now - self.since > START_S:  # the one started for it never registered
            if self.in_a_row >= RESTARTS:
                return self._give_up(f"no worker registered within {START_S:g} s")
            self.in_a_row += 1
            self.since = now
            self.cluster.sync(self._replace_dead, stuck=True)
        elif not self._live_nannies():  # its nanny closed meanwhile (lost-worker-timeout)
            self.cluster.sync(self._replace_dead, stuck=False)
        return None

    def _give_up(self, why: str) -> str:
        self.gave_up, self.restarting = True, False
        return (f"the embedded Dask worker left again ({why}) after {RESTARTS} restarts without "
                "a case finished; not starting another")

    def _live_nannies(self) -> list[str]:
        from distributed.core import Status

        return [name for name, nanny in list(self.cluster.workers.items())
                if nanny.status in (Status.init, Status.starting, Status.running)]

    async def _replace_dead(self, stuck: bool) -> None:
        """On the cluster's loop: close and forget every nanny that is closed (``stuck``: every
        nanny), then scale back to ``expected`` under new names."""
        live = set() if stuck else set(self._live_nannies())
        for name in [n for n in self.cluster.worker_spec if n not in live]:
            nanny = self.cluster.workers.pop(name, None)
            del self.cluster.worker_spec[name]
            if nanny is not None:
                task = asyncio.ensure_future(nanny.close())
                task.add_done_callback(lambda t: t.cancelled() or t.exception())
        self.cluster.scale(self.expected)

    def _why(self) -> str:
        """Why the worker left, from its last event in the scheduler's log."""
        reasons = []
        with contextlib.suppress(Exception):  # the answer is a courtesy, not the run's business
            for address in self.last_seen:
                events = self.client.get_events(address)
                closing = [e for _, e in events if e.get("action") == "closing-worker"]
                if closing:
                    reasons.append(f"it closed itself: {closing[-1].get('reason')}")
        return "; ".join(reasons) or "its process ended"
