"""Hostile lanes (issue #25, items 1-3 and the lanes' part of 12): whoever reaches a lane port
-- a stranger, the holder of a stale key, the holder of a live one -- runs nothing in the
driver, journals nothing, takes no case but its own, and leaves one log line, not a traceback.

All run in process against the real listener (:class:`attnbench.dispatch.lanes.LaneRun` with
a scripted cluster); ``submit`` with lanes on a TLS cluster: test_hostile_submit.py.

What failed before (the lane port spoke Dask's comm, which unpickles; a connection named its
lane in every message and held any number of cases): the pickle touched its marker file; one
connection claimed every queued case and handed in forged ``pass`` records, all journaled; a
second connection on a live lane emptied the run's view of what was in flight; on a TLS
cluster the driver's listener had no certificate, after ``submit`` had said "submitted".
"""

from __future__ import annotations

import asyncio
import json
import logging
import pathlib
import pickle
import secrets
import socket
import sys
import time
from types import SimpleNamespace

import pytest

from attnbench.dispatch.lane_server import MAX_UNPROVEN
from attnbench.dispatch.lane_wire import (MAX_FRAME, MAX_HANDSHAKE_FRAME, MAX_RECORD,
                                          LaneChannel, LaneProtocolError, LaneRefused, decode,
                                          encode, frame)
from attnbench.dispatch.lanes import _Lane
from attnbench.results.records import make_record
from attnbench.sweep.case import Case
from cluster_rig import certificate, wait_for  # noqa: F401
from lane_rig import (SEEDS, authenticated, closed_by_driver, finish, genuine,  # noqa: F401
                      key_of, lane_id, listening, raw, read_frame, run, serves_a_genuine_lane,
                      serves_a_tls_lane, wait_refused)


class _Touch:
    """Unpickling it creates ``path``: the proof that code ran."""

    def __init__(self, path: pathlib.Path):
        self.path = path

    def __reduce__(self):
        return (pathlib.Path.touch, (self.path,))


# -- item 1: nothing from the network is unpickled ------------------------------------------------

def _dask_frames(message: dict) -> bytes:
    """``message`` as Dask's TCP comm writes it (what the lane port used to read)."""
    from distributed.comm.tcp import _add_frames_header
    from distributed.comm.utils import to_frames

    frames = asyncio.run(to_frames(message, context={}))
    frames, _, _ = _add_frames_header(frames)
    return b"".join(bytes(f) for f in frames)


@pytest.mark.parametrize("how", ["dask comm", "pickle frame", "pickle as the auth"])
def test_a_stranger_sending_a_pickle_runs_nothing_and_journals_nothing(run, tmp_path, how):
    from distributed.protocol.serialize import ToPickle

    marker = tmp_path / "code-ran"
    evil = _Touch(marker)
    sock = raw(run)
    if how == "dask comm":  # the attack that ran os.system in the driver
        sock.sendall(_dask_frames({"op": "lane", "lane": ToPickle(evil), "done": []}))
    elif how == "pickle frame":
        sock.sendall(frame(pickle.dumps(evil)))
    else:
        read_frame(sock)  # the hello
        sock.sendall(frame(pickle.dumps(evil)))
    closed_by_driver(sock)
    wait_refused(run, 1)
    assert not marker.exists()
    serves_a_genuine_lane(run)
    journal = finish(run)
    assert not marker.exists()
    assert [r["reason"] for r in journal] == ["genuine"]  # only the genuine lane's record


def test_a_stranger_and_a_stale_key_are_refused(tmp_path):
    """A stranger (a made-up key for a real lane), then the holder of a previous run's key:
    the lane it was given there, and the new run's lane ids with it."""
    old = listening(tmp_path / "old")
    stale_channel = genuine(old, 0)  # it was a genuine key, then
    stale_channel.ask({"done": None}, 10)
    stale_channel.close()
    stale = (lane_id(old, 0), key_of(old, 0))
    finish(old)

    new = listening(tmp_path / "new")
    try:
        attempts = [(lane_id(new, 0), secrets.token_bytes(32), "a wrong proof"),
                    (stale[0], stale[1], "is not a lane of this run"),
                    (lane_id(new, 0), stale[1], "a wrong proof")]
        for lane, key, why in attempts:
            with pytest.raises(LaneRefused, match=why):
                LaneChannel.open(new.address, new.tag, lane, key, None, 10)
        wait_refused(new, len(attempts))
        assert new.queued() == SEEDS and not new.in_flight and new.done.empty()
        serves_a_genuine_lane(new, 0)  # lane 0 never connected: its key still works
    finally:
        journal = finish(new)
    assert [r["reason"] for r in journal] == ["genuine"]


# -- item 2: a live key opens one connection and takes only its own case -----------------------

def test_a_live_key_gets_one_connection_one_case_at_a_time(run):
    lane0 = genuine(run, 0)
    first = lane0.ask({"done": None}, 10)
    # A second connection on the live key (it made `run` end with cases neither recorded nor
    # named): refused; the first keeps its case in flight.
    with pytest.raises(LaneRefused, match="has connected already"):
        genuine(run, 0)
    # Another lane's id with this lane's key.
    with pytest.raises(LaneRefused, match="a wrong proof"):
        LaneChannel.open(run.address, run.tag, lane_id(run, 1), key_of(run, 0), None, 10)
    assert run.in_flight[lane_id(run, 0)].case.id == first["id"]
    # Claiming a second case without handing in the first (one connection claimed every
    # queued case): refused, and the connection is cut.
    with pytest.raises(LaneRefused, match="asked for a case while holding lease"):
        lane0.ask({"done": None}, 10)
    lane0.close()
    wait_for(lambda: not run.in_flight, 10, "the case to go back")
    assert run.queued() == SEEDS  # all back, the first at the front
    assert run.queues[next(iter(run.queues))][0].id == first["id"]
    assert run.refusals[first["id"]] == 1 and not run.deaths
    assert finish(run) == []


def _forgeries(case: Case, other: Case) -> dict:
    """Records a live lane holding ``case`` might hand in instead of its own."""
    good = make_record(case, verdict="pass", reason="forged")
    body_of_other = dict(good, case=other.to_dict())
    return {
        "another lane's case": json.dumps(make_record(other, verdict="pass", reason="forged")),
        "an unknown id": json.dumps(dict(good, id="0" * 16)),
        "a verdict the schema lacks": json.dumps(dict(good, verdict="pwned")),
        "another case in its body": json.dumps(body_of_other),
        "a NaN": json.dumps(dict(good, duration_s=float("nan"))),
        "not JSON": "{'id': 'x'}",
        "deep nesting": "[" * 100_000,
        "a 5,000-digit number": '{"id": ' + "9" * 5000 + "}",
    }


FORGERIES = ["another lane's case", "an unknown id", "a verdict the schema lacks",
             "another case in its body", "a NaN", "not JSON", "deep nesting",
             "a 5,000-digit number"]


@pytest.mark.parametrize("forgery", FORGERIES)
def test_a_forged_record_is_refused_and_journals_nothing(run, forgery):
    lane0 = genuine(run, 0)
    answer = lane0.ask({"done": None}, 10)
    case = Case.from_dict(answer["case"])
    other = next(c for c in run.queues[next(iter(run.queues))] if c.id != case.id)
    text = _forgeries(case, other)[forgery]
    with pytest.raises(LaneRefused):
        lane0.ask({"done": {"lease": answer["lease"], "record": text}}, 10)
    lane0.close()
    wait_for(lambda: not run.in_flight, 10, "the case to go back")
    assert run.queued() == SEEDS and run.refusals[case.id] == 1
    assert finish(run) == []


def test_a_record_for_a_lease_it_does_not_hold_is_refused(run):
    lane0 = genuine(run, 0)
    answer = lane0.ask({"done": None}, 10)
    record = make_record(Case.from_dict(answer["case"]), verdict="pass", reason="forged")
    with pytest.raises(LaneRefused, match="a record for lease"):
        lane0.ask({"done": {"lease": "0" * 16, "record": json.dumps(record)}}, 10)
    lane0.close()
    assert finish(run) == []


def test_a_case_refused_allowed_failures_times_is_lost_with_the_reason(run):
    """Refusals are counted per case, whatever the worker: a lane that keeps handing in what
    the journal cannot hold does not loop forever."""
    first = None
    for n in range(run.allowed_failures):
        lane = lane_id(run, n)
        run.lanes.setdefault(lane, _Lane(lane, next(iter(run.queues)), "w0", 1))
        channel = genuine(run, n)
        answer = channel.ask({"done": None}, 10)
        first = first or answer["id"]
        assert answer["id"] == first  # back at the front each time
        with pytest.raises(LaneRefused):
            channel.ask({"done": {"lease": answer["lease"], "record": "[]"}}, 10)
        channel.close()
        wait_for(lambda: not run.in_flight, 10, "the case to go back")
    journal = finish(run)
    assert [(r["id"], r["verdict"]) for r in journal] == [(first, "lost")]
    assert journal[0]["reason"].startswith("the driver refused what its lanes handed in 3 times")


def test_the_largest_genuine_record_passes_with_room_to_spare(run):
    """The margin of MAX_FRAME: a record as large as the options allow (~0.5 MB: a 64 KiB
    stderr tail, a long traceback) is journaled whole, at under a quarter of MAX_RECORD."""
    lane0 = genuine(run, 0)
    answer = lane0.ask({"done": None}, 10)
    record = make_record(Case.from_dict(answer["case"]), verdict="crash", reason="big",
                         crash={"stderr_tail": "e" * 64 * 1024, "traceback": "t" * 440_000,
                                "signal": "SIGSEGV", "exit_code": -11, "rank": 0})
    text = json.dumps(record)
    assert 500_000 < len(text) < MAX_RECORD / 4
    assert lane0.ask({"done": {"lease": answer["lease"], "record": text}}, 10)["case"]
    lane0.close()
    journal = finish(run)
    assert [len(r["crash"]["traceback"]) for r in journal] == [440_000]


def test_a_lane_sends_an_error_record_for_a_record_over_the_limit(run, monkeypatch):
    """The lane's side of MAX_RECORD: its own oversized record becomes an ``error`` record
    saying why, which the driver takes, instead of a frame the driver refuses."""
    from attnbench.dispatch import lanes

    case = run.queues[next(iter(run.queues))][0]
    huge = json.dumps(make_record(case, verdict="pass", reason="r" * MAX_RECORD))
    monkeypatch.setattr(lanes, "run_case_task_text", lambda *args: huge)
    text = lanes._run_one({"case": case.to_dict(), "attempt": 1}, {}, 1)
    record = json.loads(text)
    assert record["id"] == case.id and record["verdict"] == "error"
    assert f"over the {MAX_RECORD} a lane may hand in" in record["reason"]


def test_a_lane_the_driver_refuses_ends_with_one_line_not_a_failed_task(run, caplog,
                                                                          monkeypatch):
    """The worker's side of a refusal: the lane task logs one line and ends (the driver has
    the case back and counts the refusal), instead of failing with a traceback in the log."""
    import distributed
    from distributed.security import Security

    from attnbench.cluster import plugin
    from attnbench.dispatch import lanes

    caplog.set_level(logging.DEBUG)
    monkeypatch.setattr(distributed, "get_worker",
                        lambda: SimpleNamespace(address="tcp://w0:1", security=Security()))
    monkeypatch.setattr(plugin, "worker_state", lambda: SimpleNamespace(closed=False))
    monkeypatch.setattr(lanes, "_run_one", lambda answer, *args: "[]")  # not a record
    lanes._deposit_keys({lane_id(run, 0): key_of(run, 0).hex()})
    assert lanes.lane_task(run.address, lane_id(run, 0), {}, 1, run.tag) == 1  # it ran one
    lines = [r.getMessage() for r in caplog.records if "attnbench lane " in r.getMessage()]
    assert len(lines) == 1 and "refused by the driver" in lines[0], lines
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    wait_for(lambda: not run.in_flight, 10, "the case to go back")
    assert run.queued() == SEEDS and sum(run.refusals.values()) == 1
    assert finish(run) == []


# -- oversized and malformed frames: refused, one log line each, no traceback -------------------

def _before_auth(kind: str) -> bytes:
    return {
        "a 4 GiB length": (2**32 - 1).to_bytes(4, "big"),
        "over the handshake's limit": (MAX_HANDSHAKE_FRAME + 1).to_bytes(4, "big"),
        "not UTF-8": frame(b"\xff\xfe{"),
        "a JSON array": frame(b"[1, 2]"),
        "deep nesting": frame(b"[" * 3000),
        "a 5,000-digit number": frame(b'{"lane": ' + b"9" * 5000 + b"}"),
        "a wrong shape": frame(encode({"lane": "lane-0-0", "nonce": "x", "proof": "y"})),
        "extra fields": frame(encode({"lane": "lane-0-0", "nonce": "0" * 32, "proof": "0" * 64,
                                      "op": "run"})),
        "a frame cut short": (100).to_bytes(4, "big") + b"{",
        "Infinity": frame(b'{"lane": Infinity}'),
    }[kind]


BEFORE_AUTH = ["a 4 GiB length", "over the handshake's limit", "not UTF-8", "a JSON array",
               "deep nesting", "a 5,000-digit number", "a wrong shape", "extra fields",
               "a frame cut short", "Infinity"]


def _one_line_each(caplog, count: int) -> None:
    lines = [r for r in caplog.records if r.name == "attnbench" and "lanes" in r.getMessage()]
    assert len(lines) == count, [r.getMessage() for r in lines]
    for r in lines:
        assert r.levelno == logging.WARNING and r.exc_info is None
        assert "\n" not in r.getMessage() and "Traceback" not in r.getMessage()
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


@pytest.mark.parametrize("kind", BEFORE_AUTH)
def test_a_malformed_or_oversized_frame_before_the_handshake_is_one_line(run, caplog, kind):
    caplog.set_level(logging.DEBUG)
    sock = raw(run)
    read_frame(sock)  # the hello
    sock.sendall(_before_auth(kind))
    if kind == "a frame cut short":
        sock.shutdown(socket.SHUT_WR)
    t0 = time.monotonic()
    said = closed_by_driver(sock)
    assert time.monotonic() - t0 < 5  # refused at once, not after the handshake's timeout
    assert '"refused"' in said
    wait_refused(run, 1)
    _one_line_each(caplog, 1)
    serves_a_genuine_lane(run)


@pytest.mark.parametrize("kind, why", [
    ("over the frame limit", f"a frame of {MAX_FRAME + 1} bytes, over the {MAX_FRAME}-byte"),
    ("an altered frame", "MAC does not match"),
    ("a replayed frame", "MAC does not match"),
    ("a wrong shape", "request: fields ['done', 'lane'], expected ['done']"),
    ("unsealed JSON", "MAC does not match")])
def test_a_malformed_or_tampered_frame_after_the_handshake_is_refused(run, caplog, kind, why):
    caplog.set_level(logging.DEBUG)
    sock, session = authenticated(run, 0)
    if kind == "over the frame limit":
        sock.sendall((MAX_FRAME + 1).to_bytes(4, "big"))
    elif kind == "an altered frame":  # the same request, one space more: valid JSON
        sealed = session.seal({"done": None})
        sock.sendall(frame(sealed[:32] + b'{"done": null}'))
    elif kind == "a replayed frame":
        sealed = session.seal({"done": None})
        sock.sendall(frame(sealed))
        decode(read_frame(sock)[32:])  # a case, under a lease
        sock.sendall(frame(sealed))
    elif kind == "a wrong shape":
        sock.sendall(frame(session.seal({"done": None, "lane": "lane-0-1"})))
    else:
        sock.sendall(frame(encode({"done": None})))
    assert why in closed_by_driver(sock)
    wait_refused(run, 1)
    _one_line_each(caplog, 1)
    wait_for(lambda: not run.in_flight, 10, "the case to go back")
    assert run.queued() == SEEDS
    assert finish(run) == []


def test_silent_strangers_are_cut_and_counted(run, monkeypatch):
    """A connection that never completes the handshake is cut after HANDSHAKE_S; beyond
    MAX_UNPROVEN at once, new ones are closed at once."""
    from attnbench.dispatch import lane_server

    monkeypatch.setattr(lane_server, "HANDSHAKE_S", 0.5)
    monkeypatch.setattr(lane_server, "MAX_UNPROVEN", 2)
    assert MAX_UNPROVEN >= 2 * 256  # the documented margin over lanes connecting at once
    silent = [raw(run) for _ in range(3)]
    said = [closed_by_driver(sock) for sock in silent]
    assert ["no handshake within 0.5 s" in s for s in said] == [True, True, False]
    wait_refused(run, 3)
    assert run.server.first_refusal.startswith("busy: over 2 connections in their handshake")
    serves_a_genuine_lane(run)


# -- TLS (item 3): the listener has a certificate whichever role holds one -----------------------

@pytest.mark.parametrize("role", ["client", "worker"])
def test_tls_lanes_refuse_strangers_and_serve_a_lane_with_a_certificate(tmp_path, certificate,
                                                                         caplog, role):
    """``run --tls-*`` gives the client a certificate; a driver inside a worker (``submit``)
    has only the worker's, which is what its listener failed without."""
    from distributed.security import Security

    caplog.set_level(logging.DEBUG)
    cert, key = (str(p) for p in certificate)
    security = Security(tls_ca_file=cert, require_encryption=True,
                        **{f"tls_{role}_cert": cert, f"tls_{role}_key": key})
    run = listening(tmp_path, {"security": security,
                                "scheduler": SimpleNamespace(address="tls://127.0.0.1:8786")})
    try:
        assert run.address.startswith("tls://127.0.0.1:")
        plain = raw(run)  # no TLS at all
        plain.sendall(frame(encode({"lane": lane_id(run, 0)})))
        closed_by_driver(plain)
        import ssl

        anonymous = ssl.create_default_context(cafile=cert)  # TLS without a certificate
        anonymous.check_hostname = False
        with pytest.raises((OSError, LaneProtocolError)):
            channel = LaneChannel.open(run.address, run.tag, lane_id(run, 0), key_of(run, 0),
                                       anonymous, 10)
            channel.ask({"done": None}, 10)
        serves_a_tls_lane(run, cert, key)
    finally:
        finish(run)
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


def test_tls_without_any_certificate_is_one_line(tmp_path):
    from distributed.security import Security

    from attnbench.errors import ClusterError

    with pytest.raises(ClusterError, match="no certificate and CA for the lanes' listener"):
        listening(tmp_path, {"security": Security(require_encryption=True),
                              "scheduler": SimpleNamespace(address="tls://127.0.0.1:8786")})


def test_the_lanes_key_is_not_a_task_argument(run):
    """Task arguments are what the scheduler keeps for anyone who asks: the lane gets its key
    through the driver's client (client.run to its worker), and the lane task only the
    address, its id, options and the run tag."""
    calls = []
    run.conn.client.run = lambda func, keys, workers: calls.append((func, keys, workers))
    run.conn.client.map = lambda func, *columns, **kw: calls.append((func, columns, kw)) or []
    run.lanes.clear()
    run.hand_out()
    (deposit, keys, workers), (task, columns, _) = calls
    assert deposit.__name__ == "_deposit_keys" and task.__name__ == "lane_task"
    assert set(keys) == set(run.lanes) and workers == ["tcp://10.0.0.0:1"]
    argument_text = repr(columns)
    assert run.secret.hex() not in argument_text
    assert not any(k in argument_text for k in keys.values())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
