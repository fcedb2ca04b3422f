"""Holding the lane port (issue 41, items 2 and 3): connections that sit in their handshake --
TLS included -- count against the port's cap and are cut, and a lane that meets a full port
tries again instead of failing its worker, so a denial of service delays a run and loses
nothing.

In process against the real listener (tests/support/lane_rig.py), the cap made small
(``MAX_UNPROVEN`` 4) and attacked with cap + 6 connections. Each test here was run against the
code before the fix and failed: silent TLS connections were not counted (asyncio ran their
handshake before any handler) and held until the TLS timeout; a lane meeting a full port
raised ConnectionError at once, and three of them made the worker's queued cases ``lost``; an
EMFILE read "the run directory: Too many open files".
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import socket
import time
from types import SimpleNamespace

import pytest

from attnbench.dispatch.lanes import LANE_FAILURES, _Lane
from attnbench.results.records import make_record
from attnbench.sweep.case import Case
from cluster_rig import certificate, wait_for  # noqa: F401
from lane_rig import (SEEDS, closed_by_driver, finish, key_of, lane_id, listening,  # noqa: F401
                      raw, run, serves_a_genuine_lane, serves_a_tls_lane, wait_refused)

CAP = 4
EXTRA = 6


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _small_port(monkeypatch, handshake_s: float, evict_after_s: float) -> None:
    from attnbench.dispatch import lane_server

    monkeypatch.setattr(lane_server, "HANDSHAKE_S", handshake_s)
    monkeypatch.setattr(lane_server, "MAX_UNPROVEN", CAP)
    monkeypatch.setattr(lane_server, "EVICT_AFTER_S", evict_after_s, raising=False)


def _holding(run) -> int:
    """Connections in their handshake (a count on the code before the fix)."""
    unproven = run.server.unproven
    return unproven if isinstance(unproven, int) else len(unproven)


def _closed_within(sock: socket.socket, seconds: float) -> str:
    sock.settimeout(seconds)
    return closed_by_driver(sock)


# -- item 2: connections in their TLS handshake are counted, cut, and their files freed ----------

@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts the driver's open files")
def test_silent_connections_to_a_tls_port_count_against_its_cap(tmp_path, certificate,
                                                                monkeypatch, caplog):
    """Silent connections (no ClientHello, no certificate): beyond the cap closed at once, the
    rest cut after HANDSHAKE_S, the driver's files back to what they were, one log line each
    and no traceback; a genuine lane is served after."""
    from distributed.security import Security

    caplog.set_level(logging.DEBUG)
    _small_port(monkeypatch, handshake_s=3.0, evict_after_s=60.0)  # no cut for room here
    cert, key = (str(p) for p in certificate)
    security = Security(tls_ca_file=cert, require_encryption=True, tls_worker_cert=cert,
                        tls_worker_key=key)
    run = listening(tmp_path, {"security": security,
                               "scheduler": SimpleNamespace(address="tls://127.0.0.1:8786")})
    try:
        before = _open_fds()
        silent = [raw(run) for _ in range(CAP + EXTRA)]
        t0 = time.monotonic()
        wait_refused(run, EXTRA)
        for sock in silent[CAP:]:  # the driver closed them at once (before: held 3 s)
            _closed_within(sock, 1.5)
        assert time.monotonic() - t0 < 2.5
        assert run.server.first_refusal.startswith(f"busy: over {CAP} connections")
        for sock in silent[:CAP]:  # cut by the handshake's deadline, TLS included
            _closed_within(sock, 3.0 + 3.0)
        wait_refused(run, CAP + EXTRA)
        wait_for(lambda: _open_fds() <= before, 5, "the driver's files to be closed")

        # The attacker leaves at once: nothing stays open on the driver's side.
        for sock in [raw(run) for _ in range(CAP)]:
            sock.close()
        wait_refused(run, 2 * CAP + EXTRA)  # each seen as a handshake that failed, at once
        assert time.monotonic() - t0 < 3.0 + 3.0 + 1.0  # not after another HANDSHAKE_S
        wait_for(lambda: _open_fds() <= before and not run.server.unproven, 2,
                 "the driver's side of connections the attacker closed")

        serves_a_tls_lane(run, cert, key)
    finally:
        finish(run)
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


def test_out_of_file_descriptors_is_not_worded_as_a_disk_problem():
    """What a submitted driver said when the lane port took all its files."""
    from attnbench.dispatch.driver import _failure

    message = _failure(OSError(errno.EMFILE, "Too many open files"), None, "tcp://s:1")["message"]
    assert "file descriptors" in message and "not disk space" in message
    assert "run directory" not in message


# -- item 3: a full port keeps lanes waiting, never makes cases lost ---------------------------

@pytest.fixture
def lane_worker(monkeypatch):
    """lane_task runnable in process: a worker stand-in, each case passing at once."""
    import distributed
    from distributed.security import Security

    from attnbench.cluster import plugin
    from attnbench.dispatch import lanes

    monkeypatch.setattr(distributed, "get_worker",
                        lambda: SimpleNamespace(address="tcp://10.0.0.0:1", security=Security()))
    monkeypatch.setattr(plugin, "worker_state", lambda: SimpleNamespace(closed=False))
    monkeypatch.setattr(lanes, "_run_one", lambda answer, *args: json.dumps(make_record(
        Case.from_dict(answer["case"]), verdict="pass", reason="genuine")))
    return lanes


def test_a_lane_gets_in_past_silent_connections_holding_the_port(run, monkeypatch, lane_worker):
    """The port full of silent strangers (before: the lane's connection was closed at once
    and its task failed): the lane's next try cuts the oldest stranger and runs every case."""
    _small_port(monkeypatch, handshake_s=30.0, evict_after_s=0.3)
    silent = [raw(run) for _ in range(CAP)]
    wait_for(lambda: _holding(run) == CAP, 5, "the strangers to hold the port")
    lane_worker._deposit_keys({lane_id(run, 0): key_of(run, 0).hex()})
    assert lane_worker.lane_task(run.address, lane_id(run, 0), {}, 1, run.tag) == SEEDS
    said = _closed_within(silent[0], 2.0)  # the oldest was cut for it
    assert "busy" not in said  # cut, not told: it had not proved anything
    assert run.server.busy >= 1 and run.server.first_busy.startswith("busy: ")
    for sock in silent:
        sock.close()
    journal = finish(run)
    assert sorted(r["verdict"] for r in journal) == ["pass"] * SEEDS


def test_a_port_held_full_delays_the_cases_and_loses_none(run, monkeypatch, lane_worker):
    """Strangers keep the port full (nothing old enough to cut): each lane tries for
    BUSY_WAIT_S and ends as LaneBusy; LANE_FAILURES of them on one worker left it no lanes and
    its 4 queued cases journaled ``lost`` (before). Now: no case is lost, the worker keeps
    getting lanes, and the run says what happened."""
    _small_port(monkeypatch, handshake_s=30.0, evict_after_s=60.0)
    monkeypatch.setattr(lane_worker, "BUSY_WAIT_S", 0.5, raising=False)
    run.progress.stream = said = io.StringIO()
    silent = [raw(run) for _ in range(CAP)]
    wait_for(lambda: _holding(run) == CAP, 5, "the strangers to hold the port")
    address, group = run.workers[0].address, next(iter(run.queues))
    for n in range(2, 2 + LANE_FAILURES):
        lane = lane_id(run, n)
        run.lanes[lane] = _Lane(lane, group, address, 1)
        lane_worker._deposit_keys({lane: key_of(run, n).hex()})
        with pytest.raises(Exception) as failed:
            lane_worker.lane_task(run.address, lane, {}, 1, run.tag)
        run._lane_ended(SimpleNamespace(key=lane, status="error",
                                        exception=lambda exc=failed.value: exc))
        run.step(0)
    assert run.done.empty() and run.queued() == SEEDS  # still queued, none lost
    assert "full" in str(failed.value)
    assert type(failed.value).__name__ == "LaneBusy"
    assert run.failures[address] == 0
    run._note_busy()
    notes = said.getvalue()
    assert "stayed full for 0.5 s" in notes and "its cases stay queued" in notes
    assert "the lanes' port was full" in notes and "lanes try again" in notes
    for sock in silent:
        sock.close()
    wait_for(lambda: not run.server.unproven, 5, "the strangers to be gone")
    serves_a_genuine_lane(run)  # the strangers gone, lanes get in again
    journal = finish(run)
    assert [r["verdict"] for r in journal] == ["pass"]


def test_a_lane_busy_without_a_full_port_is_a_failure_of_its_worker(run):
    """A lane over TLS cut for another reason (a certificate its driver refuses) sees what a
    full port looks like: believed only if the listener was in fact full, else it counts
    against its worker as before (not an endless round of lanes that never get in)."""
    from attnbench.dispatch.lane_wire import LaneBusy

    address, group = run.workers[0].address, next(iter(run.queues))
    lane = lane_id(run, 2)
    run.lanes[lane] = _Lane(lane, group, address, 1)
    busy = LaneBusy("the driver closed the connection in its TLS handshake")
    assert run.server.busy == 0
    run._lane_ended(SimpleNamespace(key=lane, status="error", exception=lambda: busy))
    assert run.failures[address] == 1
    finish(run)
