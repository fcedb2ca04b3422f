"""A driver's lanes listening on loopback, on a scripted cluster (no Dask), and the ways to
talk to them: as a genuine lane (:func:`genuine`), by hand after a genuine handshake
(:func:`authenticated`), or as raw bytes (:func:`raw`). Used by tests/hostile/ (the lane
port's attacks); the ``run`` fixture is taken by importing it."""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import socket
import time
from types import SimpleNamespace

import pytest

from attnbench.dispatch.lane_wire import (NONCE_BYTES, LaneChannel, Session, decode, encode,
                                          frame, lane_key, lane_proof)
from attnbench.dispatch.lanes import LaneRun, _Lane
from attnbench.dispatch.loop import Progress
from attnbench.results.records import make_record
from attnbench.sweep.case import Case
from cluster_rig import FakeConnection, scripted_store, wait_for, worker_infos

SEEDS = 4
"""Cases queued in each run: lanes 0 and 1 take them."""


# -- a driver's lanes listening, on a scripted cluster -------------------------------------------

def listening(tmp_path: pathlib.Path, client_extra: dict | None = None) -> LaneRun:
    tmp_path.mkdir(exist_ok=True)
    store = scripted_store(tmp_path, ["A"], seeds=SEEDS)
    conn = FakeConnection(None, [worker_infos(("A", 2))])
    conn.client.scheduler = SimpleNamespace(address="tcp://127.0.0.1:8786")
    for name, value in (client_extra or {}).items():
        setattr(conn.client, name, value)
    run = LaneRun(store, conn, Progress(0, 0, open(os.devnull, "w")))
    run.plan()
    run._queue_todo()
    group = next(iter(run.queues))
    for n in range(2):  # what hand_out would have started: two lanes, on w0 and w1
        lane = lane_id(run, n)
        run.lanes[lane] = _Lane(lane, group, f"w{n}", 1)
    run._listen()
    return run


@pytest.fixture
def run(tmp_path):
    run = listening(tmp_path)
    yield run
    run.stop()
    run.store.close()


def lane_id(run: LaneRun, n: int) -> str:
    return f"lane-{run.tag}-{n}"


def key_of(run: LaneRun, n: int) -> bytes:
    return lane_key(run.secret, run.tag, lane_id(run, n))


def genuine(run: LaneRun, n: int) -> LaneChannel:
    """Lane n as its worker would connect: with the key the driver handed it."""
    return LaneChannel.open(run.address, run.tag, lane_id(run, n), key_of(run, n), None, 10)


def endpoint(run: LaneRun) -> tuple[str, int]:
    host, port = run.address.split("://")[1].rsplit(":", 1)
    return host, int(port)


def raw(run: LaneRun) -> socket.socket:
    sock = socket.create_connection(endpoint(run), timeout=10)
    return sock


def read_frame(sock: socket.socket) -> bytes:
    head = recv_exactly(sock, 4)
    return recv_exactly(sock, int.from_bytes(head, "big"))


def recv_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionResetError("closed")
        data += chunk
    return data


def closed_by_driver(sock: socket.socket) -> str:
    """What the driver said before it hung up (its refusal), '' if nothing; fails if it
    keeps the connection open."""
    said = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, ConnectionAbortedError):
            break
        except socket.timeout:
            raise AssertionError(f"the driver kept the connection open (it said {said!r})")
        if not chunk:
            break
        said += chunk
    sock.close()
    return said.decode("utf-8", "replace")


def authenticated(run: LaneRun, n: int) -> tuple[socket.socket, Session]:
    """Lane n's connection by hand, to send what no genuine lane would."""
    sock = raw(run)
    hello = decode(read_frame(sock))
    nd, nl, lane = hello["nonce"], secrets.token_hex(NONCE_BYTES), lane_id(run, n)
    sock.sendall(frame(encode({"lane": lane, "nonce": nl,
                               "proof": lane_proof(key_of(run, n), run.tag, lane, nd, nl)})))
    assert set(decode(read_frame(sock))) == {"proof"}
    return sock, Session(key_of(run, n), run.tag, lane, nd, nl, side="lane")


def finish(run: LaneRun) -> list[dict]:
    """Stop the run as its loop would; the journal it leaves."""
    deadline = time.monotonic() + 5
    while not run.done.empty() and time.monotonic() < deadline:
        run.step(0)
    run.stop()
    run.store.close()
    path = run.store.dir / "records.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def serves_a_genuine_lane(run: LaneRun, n: int = 1) -> None:
    """After whatever came before, lane n still runs a case to the journal."""
    channel = genuine(run, n)
    answer = channel.ask({"done": None}, 10)
    record = make_record(Case.from_dict(answer["case"]), verdict="pass", reason="genuine")
    assert channel.ask({"done": {"lease": answer["lease"], "record": json.dumps(record)}},
                       10)["case"] is not None
    channel.close()


def serves_a_tls_lane(run: LaneRun, cert, key, n: int = 1) -> None:
    """Lane n, with the worker's certificate, is still given a case over TLS."""
    from distributed.security import Security

    context = Security(tls_ca_file=cert, tls_worker_cert=cert, tls_worker_key=key
                       ).get_connection_args("worker")["ssl_context"]
    channel = LaneChannel.open(run.address, run.tag, lane_id(run, n), key_of(run, n), context,
                               10)
    assert channel.ask({"done": None}, 10)["case"] is not None
    channel.close()


def wait_refused(run: LaneRun, count: int) -> None:
    wait_for(lambda: run.server.refused >= count, 10, f"{count} refusals")
