"""The worker plugin (attnbench/cluster/plugin.py): a worker's lease table and rank pools, set
up once per worker however the plugin reaches it, and torn down with the worker, rank process
groups included. In-process LocalClusters (a second or two each) and one embedded cluster as
`attnbench run` starts it."""

from __future__ import annotations

import os
import threading
import time

import pytest

from attnbench.cluster.plugin import CASE_RUNNER, NAME, WorkerState, register, worker_state
from attnbench.cluster.task import CASE_FUNC
from attnbench.cluster.worker import LeaseTimeout

from helpers import alive

T = "attnbench.execution.testing:"



def _group(pgid: int) -> list[int]:
    """Live processes of process group ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry))
    return members


def _wait(predicate, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def _start_ranks(_: object = None) -> dict:
    """Task: lease a device and a rank pool from this worker's plugin, leave a rank (and a
    grandchild in its process group) running in the pool."""
    state = worker_state()
    state.pools.preload = ()  # these ranks run a test function: no torch import
    with state.leases.lease(1, timeout=30):
        with state.pools.lease(world_size=1) as pool:
            outcome = pool.run(T + "spawn_grandchild", None, timeout=30)
    assert outcome.kind == "ok", outcome
    return {"rank": outcome.pids[0], "grandchild": outcome.result, "plugin": id(state),
            "worker_pid": os.getpid()}


@pytest.fixture
def setups(monkeypatch):
    """Counts WorkerState.setup calls in this process (the in-process clusters' workers)."""
    calls = []
    original = WorkerState.setup

    def counting(self, worker):
        calls.append(worker.address)
        return original(self, worker)

    monkeypatch.setattr(WorkerState, "setup", counting)
    return calls


def _in_process_cluster():
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                           resources={"device": 2, "kind-cpu": 2}, dashboard_address=None)
    return cluster, Client(cluster)


def test_the_ranks_import_the_case_runner():
    assert CASE_FUNC.split(":")[0] == CASE_RUNNER


@pytest.mark.parametrize("registered", [True, False], ids=["registered", "set-up-on-first-use"])
def test_set_up_once_per_worker_and_teardown_kills_the_rank_groups(setups, registered):
    cluster, client = _in_process_cluster()
    try:
        worker = next(iter(cluster.workers.values()))
        if registered:
            register(client)
            register(client)  # every client registers: the worker keeps the one it has
            assert len(setups) == 1
        # Concurrent first tasks on a worker without the plugin set up one between them.
        ran = client.gather(client.map(_start_ranks, range(2), pure=False))
        register(client)
        plugin = worker.plugins[NAME]
        assert len(setups) == 1 and {r["plugin"] for r in ran} == {id(plugin)}
        assert plugin.leases.kind == "cpu" and plugin.leases.ids == ("0", "1")
        assert all(alive(r["rank"]) and alive(r["grandchild"]) for r in ran)
    finally:
        client.close()
        cluster.close()
    # This process (the worker's) lives on: only the teardown can have ended the ranks.
    assert plugin.closed and len(plugin.pools) == 0
    for r in ran:
        assert _wait(lambda: not _group(r["rank"])), f"rank group {r['rank']}: {_group(r['rank'])}"
        assert not alive(r["grandchild"])
    with pytest.raises(LeaseTimeout, match="closing"):
        with plugin.leases.lease(1):
            pass


def test_teardown_ends_a_case_waiting_for_devices():
    from attnbench.cluster.worker import DeviceLeases

    leases = DeviceLeases(["0"], kind="cpu", gpu=False)
    errors = []

    def waiter():
        try:
            with leases.lease(1, timeout=60):
                pass
        except LeaseTimeout as exc:
            errors.append(str(exc))

    with leases.lease(1):
        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.2)
        leases.close()
        thread.join(timeout=5)
    assert not thread.is_alive() and errors and "closing" in errors[0]


def test_no_rank_outlives_the_embedded_cluster():
    """`attnbench run`'s LocalCluster (worker processes): the plugin is registered as it
    starts, set up once, and no rank process (nor its group) outlives the cluster."""
    from attnbench.cluster.connect import connect

    conn = connect(None, slots=1)
    try:
        info = conn.client.run(lambda dask_worker: id(dask_worker.plugins[NAME]))
        ran = conn.client.submit(_start_ranks, pure=False).result(timeout=60)
        register(conn.client)
        again = conn.client.run(lambda dask_worker: id(dask_worker.plugins[NAME]))
        assert info == again and ran["plugin"] in info.values()
        assert alive(ran["rank"]) and _group(ran["rank"])
    finally:
        conn.close()
    assert _wait(lambda: not _group(ran["rank"])), _group(ran["rank"])
    assert not alive(ran["grandchild"]) and _wait(lambda: not alive(ran["worker_pid"]))
