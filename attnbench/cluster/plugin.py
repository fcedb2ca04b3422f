"""What one Dask worker owns, held by a Dask ``WorkerPlugin``: its device lease table and its
warm rank pools.

:class:`WorkerState` (plugin name ``attnbench``) is set up once per worker: the lease table
from the worker's environment or Dask resources
(:meth:`~attnbench.cluster.worker.DeviceLeases.from_environment`) and an empty
:class:`~attnbench.execution.pool_set.PoolSet` whose ranks import the case runner as they start.
Its teardown, when the worker closes, closes the pools (every rank's process group is killed)
and the lease table (nothing more is leased; a case still waiting for devices gives up). The
task (:func:`attnbench.cluster.task.run_case_task`), the lanes and simulated cases take both
from :func:`worker_state`.

How it reaches a worker: registered under one name and idempotently, so a scheduler that has
it sends nothing, and hands it to every worker that joins later.

* The embedded LocalCluster (``run``, ``selftest``): registered by
  :func:`~attnbench.cluster.connect.connect` as soon as the cluster is up.
* ``attnbench worker`` (also ``python -m attnbench.cluster.worker`` under dask-jobqueue,
  ``--simulate-gpus``, TLS): it runs ``dask worker --preload attnbench.cluster.plugin``, whose
  :func:`dask_setup` registers it with the scheduler before the worker joins; the worker gets
  it as it joins, set up once.
* Workers someone else started (a plain ``dask worker``, a Kubernetes spec): registered from
  the client on connect (:func:`~attnbench.cluster.connect.connect`: ``run --scheduler``,
  ``submit``, ``--cluster slurm``).
* The detached driver (``submit``): ``submit`` registered it on connect; the driver registers
  it again from its ``worker_client`` (nothing happens unless the scheduler lost it).

The fallback: a task on a worker that has no plugin (its scheduler never heard of it: a client
that registered nothing, a scheduler that was out of reach when the worker started) registers
it on first use, with a warning in the worker's log (:func:`worker_state`).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
from typing import Optional

from distributed.diagnostics.plugin import WorkerPlugin

from attnbench.cluster.worker import DeviceLeases
from attnbench.execution.pool_set import PoolSet
from attnbench.resources import ENV_PREWARM, ENV_SIMULATE, ENV_THREADS

log = logging.getLogger("attnbench.cluster.plugin")

NAME = "attnbench"
CASE_RUNNER = "attnbench.execution.case_runner"
"""The module every rank imports as it starts (torch with it), so no case pays for it."""
SCHEDULER_WAIT_S = 10.0
"""How long a worker waits for its scheduler to take the plugin (as it starts: the scheduler
may start after its workers)."""

_fallback_lock = threading.Lock()  # two tasks that find no plugin set up one


class WorkerState(WorkerPlugin):
    """A worker's device lease table (:attr:`leases`) and rank pools (:attr:`pools`)."""

    name = NAME
    idempotent = True  # registered again (every client does): the worker keeps the one it has

    def __init__(self) -> None:
        self._leases: Optional[DeviceLeases] = None
        self._leases_error: Optional[ValueError] = None
        self.pools: Optional[PoolSet] = None
        self.closed = False
        """Torn down: the pools were closed under whatever ran in them."""

    def setup(self, worker) -> None:
        try:
            self._leases = DeviceLeases.from_environment(os.environ,
                                                         worker.state.total_resources)
        except ValueError as exc:  # no devices: its cases say so (no worker fails to start)
            self._leases_error = exc
        # The pools this worker process started as it started (ENV_PREWARM), once.
        self.pools = _early.pop("pools", None) or _pool_set()

    async def teardown(self, worker) -> None:
        self.closed = True
        await asyncio.to_thread(self.close)  # ranks are given a moment to exit: off the loop

    def close(self) -> None:
        """Close the pools (their rank process groups are killed) and the lease table."""
        if self.pools is not None:
            self.pools.close()
            atexit.unregister(self.pools.close)
        if self._leases is not None:
            self._leases.close()

    @property
    def leases(self) -> DeviceLeases:
        if self._leases is None:
            raise ValueError(str(self._leases_error or "the worker plugin was not set up"))
        return self._leases


_early: dict[str, PoolSet] = {}
"""The pools :func:`dask_setup` started before the worker joined, for its plugin to adopt (a
worker process has one plugin state; the scheduler's copy of the plugin is set up at the join,
after the pools began to start)."""


def _pool_set() -> PoolSet:
    pools = PoolSet(int(os.environ.get(ENV_THREADS, "0")) or None, preload=(CASE_RUNNER,))
    atexit.register(pools.close)  # a worker process that ends without its teardown
    return pools


def start_early(worker) -> None:
    """Start this worker's rank pools now, as the worker process starts (ENV_PREWARM: the
    embedded cluster), so they are up by the first case; in a thread, the worker goes on."""
    if os.environ.get(ENV_PREWARM) != "1" or os.environ.get(ENV_SIMULATE) or "pools" in _early:
        return
    try:
        leases = DeviceLeases.from_environment(os.environ, worker.state.total_resources)
    except ValueError:  # no devices: its cases say so
        return
    pools = _early["pools"] = _pool_set()
    threading.Thread(target=prewarm, args=(pools, leases), name="attnbench-prewarm",
                     daemon=True).start()


def prewarm(pools: PoolSet, leases: DeviceLeases) -> None:
    """A one-rank pool per device (per slot on a CPU): what the first cases of a sweep lease
    (issue 40, item 9: the first record waited for a rank's start, torch's import, 5 s under
    load). Multi-rank cases still start their own pools."""
    envs = [[{"CUDA_VISIBLE_DEVICES": d}] if leases.gpu else None  # as Lease.pool_env(1)
            for d in leases.ids]
    failed = pools.prewarm(envs)
    if failed is not None and not pools.closed:  # (the worker closing kills its start)
        log.warning("could not pre-start a rank pool (%s); cases start their own",
                    failed.summary or failed.kind)


def worker_state() -> WorkerState:
    """This worker's :class:`WorkerState`. On a worker that has none it is registered now with
    the scheduler (which hands it to every worker, this one included, and to those that join
    later: no client registering it afterwards replaces it), else set up here alone."""
    from distributed import get_worker
    from distributed.core import Status
    from distributed.utils import sync

    worker = get_worker()
    state = worker.plugins.get(NAME)
    if state is not None:
        return state
    with _fallback_lock:
        if (state := worker.plugins.get(NAME)) is None:
            if worker.status in (Status.closing, Status.closed, Status.failed):
                raise RuntimeError(f"worker {worker.address} is closing")
            log.warning("worker %s: no %s plugin registered; registering it for this task",
                        worker.address, NAME)
            sync(worker.loop, _register_with_scheduler, worker)
            if NAME not in worker.plugins:
                sync(worker.loop, worker.plugin_add, plugin=WorkerState(), name=NAME,
                     catch_errors=False)
            state = worker.plugins[NAME]
    return state


def register(client) -> None:
    """Register the plugin with ``client``'s scheduler: its workers get it now and those that
    join later as they join. Idempotent. A failure is logged; :func:`worker_state` then
    covers the workers."""
    try:
        client.register_plugin(WorkerState())
    except Exception as exc:  # noqa: BLE001 -- the run goes on without it
        log.warning("could not register the %s worker plugin (%s: %s); each worker sets it up "
                    "on its first case", NAME, type(exc).__name__, str(exc)[:300])


async def _register_with_scheduler(worker) -> None:
    """What :func:`register` does, from a worker (at most :data:`SCHEDULER_WAIT_S`)."""
    from distributed.protocol.pickle import dumps

    try:
        await asyncio.wait_for(worker.scheduler.register_worker_plugin(
            plugin=dumps(WorkerState()), name=NAME, idempotent=True), SCHEDULER_WAIT_S)
    except Exception as exc:  # noqa: BLE001 -- unreachable, or another worker failed setup
        log.warning("could not register the %s plugin with the scheduler (%s: %s)", NAME,
                    type(exc).__name__, str(exc)[:300])


async def dask_setup(worker) -> None:
    """``dask worker --preload attnbench.cluster.plugin`` (what ``attnbench worker`` runs):
    register the plugin with the scheduler before this worker joins it, so it gets it as it
    joins, once. If the scheduler cannot be reached yet, the client registers it on connect
    (or the worker's first case does). The embedded cluster preloads it too, for
    :func:`start_early`."""
    start_early(worker)
    await _register_with_scheduler(worker)
