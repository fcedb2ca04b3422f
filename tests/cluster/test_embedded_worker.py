"""The embedded cluster keeps its worker (issue #25, item 13).

Under load an embedded ``attnbench run`` once ended with "case ... waits for a worker: its
worker left; giving up after 60 s" and 476 of 1,585 cases pending: the worker's nanny did not
bring it back, and nothing else can run the cases. Here the worker process is SIGKILLed mid-run
(its nanny restarts it), also with ``lost-worker-timeout`` at 0 s (the LocalCluster then closes
the nanny while it restarts the worker, as it does under load when the restart takes longer than
15 s), and a worker closes itself (which closes its nanny). Every time the run must finish
with every case recorded once and one line saying the worker was replaced.
:class:`~attnbench.cluster.keeper.WorkerKeeper`'s limits are checked with a stand-in cluster.

Mutants and margins: without the keeper (``keeper=None`` in ``_connect_local``) the 0 s run
exits 3 with cases pending, and the self-closed worker never comes back (the test waits 60 s
for what takes 1-3 s here); without the frozen worker list (``refresh_workers`` storing the
empty list) the runs print "waits for a worker ... giving up" besides the one line.
"""

from __future__ import annotations

import asyncio
import collections
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from distributed.core import Status
import pytest

from attnbench.cluster import keeper as keeper_mod
from attnbench.cluster.connect import WorkerInfo
from attnbench.cluster.keeper import RESTARTS, WorkerKeeper
from helpers import ROOT, attnbench_cmd

CASES = 6
SLEEP_S = "0.5"  # a case takes about a second: the kill lands mid-run, the run stays short


def _sweep(tmp: Path) -> Path:
    path = tmp / "keep.yaml"
    path.write_text(json.dumps({
        "name": "keep", "axes": {"seed": list(range(CASES))},
        "defaults": {"batch": 1, "heads_q": 2, "head_dim": 16, "seqlen_q": 32, "dtype": "fp32",
                     "backend": "sleepy_backend:make"},
        "options": {"timeout_s": 60, "timing": {"enabled": False}}}))
    return path


def _lines(out: Path) -> list[dict]:
    path = out / "records.jsonl"
    return [json.loads(l) for l in path.read_text().splitlines()] if path.exists() else []


def _worker_process(client_pid: int) -> psutil.Process:
    """The embedded worker: the client's child started by multiprocessing's spawn (the nanny
    lives in the client itself; the other spawned child is the resource tracker)."""
    return next(p for p in psutil.Process(client_pid).children()
                if "spawn_main" in " ".join(p.cmdline()))


@pytest.mark.parametrize("dispatch, lost_worker_timeout", [
    ("tasks", "0s"),    # the nanny is closed under its restart: only the keeper brings one back
    ("lanes", "15s"),   # Dask's default: the nanny restarts it
])
def test_sigkill_of_the_embedded_worker_mid_run(cli_env, tmp_path, dispatch,
                                                lost_worker_timeout):
    out = tmp_path / "run"
    env = dict(cli_env, SLEEPY_S=SLEEP_S,
               DASK_DISTRIBUTED__DEPLOY__LOST_WORKER_TIMEOUT=lost_worker_timeout)
    log = tmp_path / "client.log"
    with open(log, "w") as fh:
        client = subprocess.Popen([*attnbench_cmd(), "run", str(_sweep(tmp_path)), "--out",
                                   str(out), "--no-report", "--workers", "1", "--worker-wait",
                                   "30", "--dispatch", dispatch], stdout=fh,
                                  stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    try:
        deadline = time.monotonic() + 120
        while len(_lines(out)) < 2 and client.poll() is None:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        victim = _worker_process(client.pid)
        victim.send_signal(signal.SIGKILL)
        assert client.wait(timeout=180) == 0, log.read_text()
    finally:
        if client.poll() is None:
            client.kill()
    text = log.read_text()
    records = _lines(out)
    assert len(records) == len({r["id"] for r in records}) == CASES, text
    assert {r["verdict"] for r in records} == {"pass"}, text
    notes = [l for l in text.splitlines() if "worker" in l and "attnbench: " in l
             and "running on" not in l]
    # Replaced by the keeper, or by its nanny between two looks of the run: one line either way.
    assert len(notes) == 1 and notes[0].startswith(
        "attnbench: the embedded Dask worker left (its process ended); ") and notes[0].endswith(
        "the run goes on"), text
    assert "Traceback" not in text


def test_a_worker_that_closes_itself_is_replaced():
    """``Worker.close`` (what a broken stream to the scheduler calls) closes the nanny too: no
    restart from Dask; the keeper starts a new worker and names the reason."""
    from attnbench.cluster.connect import connect

    conn = connect(None, 1)
    try:
        keeper = conn.keeper
        first = conn.workers()
        assert keeper.check(first, 0) is None and not keeper.restarting

        def close_itself(dask_worker):
            dask_worker.loop.add_callback(dask_worker.close, reason="test-closes-itself")

        conn.client.run(close_itself)
        notes, deadline = [], time.monotonic() + 60
        while True:
            workers = conn.workers()
            if (note := keeper.check(workers, 0)) is not None:
                notes.append(note)
            if workers and workers[0].address != first[0].address:
                break
            assert time.monotonic() < deadline, (notes, dict(conn.cluster.workers))
            time.sleep(0.2)
        assert notes == ["the embedded Dask worker left (it closed itself: test-closes-itself); "
                         "starting a new one, the run goes on"]
        assert workers[0].resources == first[0].resources
        assert conn.client.submit(sum, [1, 2], pure=False).result(timeout=60) == 3
    finally:
        conn.close()


# -- the keeper's limits, with a stand-in cluster ---------------------------------------------


class _Nanny:
    def __init__(self):
        self.status = Status.running

    async def close(self):
        self.status = Status.closed


class _Cluster:
    """What the keeper uses of a LocalCluster: worker_spec, workers, scale, sync."""

    def __init__(self):
        self.worker_spec, self.workers, self.started = {0: {}}, {0: _Nanny()}, 1

    def scale(self, n):
        while len(self.worker_spec) < n:
            self.worker_spec[self.started] = {}
            self.workers[self.started] = _Nanny()
            self.started += 1

    def sync(self, func, **kwargs):
        async def call():
            await func(**kwargs)
            await asyncio.sleep(0)  # the close tasks it started

        asyncio.run(call())


class _Client:
    def get_events(self, address):
        return []


def _keeper():
    return WorkerKeeper(_Cluster(), _Client())


ONE = [WorkerInfo("tcp://127.0.0.1:1", "0", {"device": 1})]


def test_keeper_replaces_a_closed_nanny_under_a_new_name():
    keeper = _keeper()
    keeper.check(ONE, 0)
    keeper.cluster.workers[0].status = Status.closed
    assert keeper.check([], 0).startswith("the embedded Dask worker left (its process ended)")
    assert keeper.restarting and list(keeper.cluster.worker_spec) == [1]
    assert keeper.check([], 0) is None  # one line per departure
    assert keeper.check(ONE, 0) is None and not keeper.restarting


def test_keeper_gives_up_after_restarts_without_a_case_and_not_with_progress():
    keeper = _keeper()
    written = 0
    for departure in range(RESTARTS):
        assert "starting a new one" in keeper.check([], written)
        assert keeper.check(ONE, written) is None
        written += 1  # a case finished on each new worker: never broken
    keeper = _keeper()
    for departure in range(RESTARTS):
        assert "starting a new one" in keeper.check([], 0)
        keeper.check(ONE, 0)
    note = keeper.check([], 0)
    assert note.startswith("the embedded Dask worker left again") and "not starting" in note
    assert not keeper.restarting and keeper.check([], 0) is None


def test_keeper_replaces_a_worker_that_never_registers(monkeypatch):
    keeper = _keeper()
    keeper.check(ONE, 0)
    keeper.check([], 0)
    clock = [time.monotonic() + keeper_mod.START_S + 1]
    monkeypatch.setattr(keeper_mod.time, "monotonic", lambda: clock[0])
    assert keeper.check([], 0) is None
    assert list(keeper.cluster.worker_spec) == [1]  # the stuck nanny closed, a new one started
    assert keeper.in_a_row == 2
