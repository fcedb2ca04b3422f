"""The lanes' wire: plain JSON frames of known shapes, authenticated per run (standard library
only; the driver's listener is :mod:`~.lane_server`, the lane's end :class:`LaneChannel`).

Why not Dask's comm: it unpickles what it reads (a ``__Pickled__`` sub-frame is loaded even
with ``deserialize=False``, and its handshake is read before any handler runs), so whoever
reached a lane port ran code in the driver (issue #25, item 1). Here nothing received is
unpickled, imported or evaluated: a frame is 4 bytes of length (at most :data:`MAX_FRAME`)
and a UTF-8 JSON object, checked field by field against the one shape expected at that point
of the conversation; anything else ends the connection with a one-line reason.

The conversation (D: the driver, L: a lane)::

    D: {"proto", "v", "run", "nonce": Nd}                  hello, in clear
    L: {"lane", "nonce": Nl, "proof": MAC(K, lane|Nd|Nl)}   proves it holds the lane's key K
    D: {"proof": MAC(K, driver|Nd|Nl)} or {"refused"}       proves the driver holds it too
    then, every frame sealed (MAC over direction, sequence number and body, session key
    MAC(K, session|Nd|Nl)): a replayed, reordered, cut or altered frame is refused.
    L: {"done": null | {"lease", "record"}}                 the last case's record, and "next"
    D: {"case": null} | {"case", "id", "attempt", "lease"}  one case, or none: the lane ends
    D: {"refused": why}                                     then the connection closes

K never crosses the wire: ``K = MAC(run secret, run tag | lane id)``, the secret drawn by the
driver for this run only (:class:`~attnbench.dispatch.lanes.LaneRun`) and never written anywhere;
how K reaches the lane's worker is in :mod:`~.lanes`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import socket
import ssl
import struct
from typing import Any, Optional

PROTO = "attnbench-lanes"
VERSION = 1
"""Bumped on any change of a message's shape: a driver and a lane of different versions refuse
each other in the handshake, in one line, instead of misreading a field."""
MAX_FRAME = 4 * 2**20
"""The largest record the options allow is ~0.5 MB (a 64 KiB stderr tail, 10,000 raw samples
x 2 passes x ~20 characters, a traceback); records measured 3-5 KB. 4 MiB is ~8x that, and the
most one connection can make the driver buffer."""
MAX_HANDSHAKE_FRAME = 4096
"""Hello and proofs are ~200 bytes; before a connection has proved anything it gets no more."""
MAX_RECORD = MAX_FRAME - 4096
"""A record's JSON text, leaving room for the request around it and its MAC."""
NONCE_BYTES = 16
"""128-bit nonces: two connections never share a challenge."""
KEY_BYTES = 32
"""HMAC-SHA256's block-sized key: the run secret and each lane's key."""
_MAC_BYTES = 32
_LENGTH = struct.Struct(">I")
_SEQUENCE = struct.Struct(">Q")
LANE_ID = re.compile(r"lane-[0-9a-f]{1,32}-[0-9]{1,9}")
"""What :class:`~attnbench.dispatch.lanes.LaneRun` names its lanes (``lane-<run tag>-<n>``)."""
RUN_TAG = re.compile(r"[0-9a-f]{1,32}")
_HEX = re.compile(r"[0-9a-f]+")
LEASE_HEX = 16
"""A lease id: 64 random bits, so a connection cannot guess another's."""
BUSY = "busy: "
"""How the driver's refusal of a connection starts when its port is full (too many
connections in their handshake): the lane tries again, its worker is not at fault."""
_CUT = (ConnectionResetError, ConnectionAbortedError, BrokenPipeError, ssl.SSLEOFError,
        ssl.SSLZeroReturnError)
"""What a lane sees when the driver accepts its connection and closes it before the
handshake is done: a full port (over TLS it cannot say so) or the run stopping."""


class LaneProtocolError(Exception):
    """A frame that breaks the protocol; ``str()`` is one line, printable, safe to log."""


class LaneRefused(LaneProtocolError):
    """The other end refused this connection (its reason in the message)."""


class LaneBusy(LaneRefused):
    """The driver's lane port was full: try again later (no fault of this lane or worker)."""


# -- keys and proofs ------------------------------------------------------------------------------

def new_secret() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def lane_key(secret: bytes, run: str, lane: str) -> bytes:
    """Lane ``lane``'s key in run ``run``: a MAC of both under the run's secret."""
    return _mac(secret, b"lane-key", run, lane)


def _mac(key: bytes, label: bytes, *parts: str) -> bytes:
    message = label + b"".join(b"\0" + p.encode() for p in parts)
    return hmac.new(key, message, hashlib.sha256).digest()


def lane_proof(key: bytes, run: str, lane: str, nd: str, nl: str) -> str:
    return _mac(key, b"lane-proof", run, lane, nd, nl).hex()


def driver_proof(key: bytes, run: str, lane: str, nd: str, nl: str) -> str:
    return _mac(key, b"driver-proof", run, lane, nd, nl).hex()


def proofs_match(expected: str, got: str) -> bool:
    return hmac.compare_digest(expected.encode(), got.encode())


class Session:
    """Seals and opens the frames of one authenticated connection: each direction has its own
    sequence, so a frame is accepted once, in order, from the side that sent it."""

    def __init__(self, key: bytes, run: str, lane: str, nd: str, nl: str, side: str):
        self.key = _mac(key, b"session", run, lane, nd, nl)
        self.mine, self.theirs = (b"D", b"L") if side == "driver" else (b"L", b"D")
        self.sent = self.received = 0

    def _tag(self, direction: bytes, sequence: int, body: bytes) -> bytes:
        return hmac.new(self.key, direction + _SEQUENCE.pack(sequence) + body,
                        hashlib.sha256).digest()

    def seal(self, message: dict) -> bytes:
        body = encode(message)
        tag = self._tag(self.mine, self.sent, body)
        self.sent += 1
        return tag + body

    def open(self, frame: bytes) -> dict:
        tag, body = frame[:_MAC_BYTES], frame[_MAC_BYTES:]
        if not hmac.compare_digest(tag, self._tag(self.theirs, self.received, body)):
            raise LaneProtocolError("a frame whose MAC does not match (altered, replayed or "
                                    "out of order)")
        self.received += 1
        return decode(body)


# -- frames ------------------------------------------------------------------------------------

def encode(message: dict) -> bytes:
    return json.dumps(message, separators=(",", ":"), allow_nan=False).encode()


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number the lanes send")


def decode(body: bytes) -> dict:
    """A JSON object, or :class:`LaneProtocolError` (never another exception: a stranger's
    bytes must not become a traceback)."""
    try:
        value = json.loads(body.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise LaneProtocolError(f"a frame that is not UTF-8 JSON ({type(exc).__name__}: "
                                f"{_short(str(exc), 80)})") from None
    if not isinstance(value, dict):
        raise LaneProtocolError(f"a frame holding a {type(value).__name__}, expected a JSON "
                                "object")
    return value


def frame(body: bytes) -> bytes:
    return _LENGTH.pack(len(body)) + body


def frame_length(head: bytes, limit: int) -> int:
    (length,) = _LENGTH.unpack(head)
    if length > limit:
        raise LaneProtocolError(f"a frame of {length} bytes, over the {limit}-byte limit")
    return length


def _short(text: str, limit: int = 120) -> str:
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= limit else text[:limit] + "..."


# -- message shapes ----------------------------------------------------------------------------

def _fields(name: str, message: dict, keys: set) -> None:
    if set(message) != keys:
        raise LaneProtocolError(f"{name}: fields {_short(str(sorted(map(str, message))))}, "
                                f"expected {sorted(keys)}")


def _text(name: str, value: Any, pattern: re.Pattern, length: Optional[int] = None) -> str:
    if not (isinstance(value, str) and pattern.fullmatch(value)
            and (length is None or len(value) == length)):
        raise LaneProtocolError(f"{name}: got {_short(repr(value), 80)}, expected "
                                f"{'hex' if pattern is _HEX else 'a ' + name}"
                                f"{f' of {length} characters' if length else ''}")
    return value


def check_hello(message: dict) -> dict:
    _fields("hello", message, {"proto", "v", "run", "nonce"})
    if message["proto"] != PROTO or message["v"] != VERSION:
        raise LaneProtocolError(f"the driver speaks {_short(repr(message['proto']), 40)} "
                                f"v{_short(repr(message['v']), 20)}, this lane {PROTO} "
                                f"v{VERSION}: run the same attnbench on the driver and workers")
    _text("run", message["run"], RUN_TAG)
    _text("nonce", message["nonce"], _HEX, 2 * NONCE_BYTES)
    return message


def check_auth(message: dict) -> dict:
    _fields("auth", message, {"lane", "nonce", "proof"})
    _text("lane", message["lane"], LANE_ID)
    _text("nonce", message["nonce"], _HEX, 2 * NONCE_BYTES)
    _text("proof", message["proof"], _HEX, 2 * _MAC_BYTES)
    return message


def check_request(message: dict) -> Optional[dict]:
    """A lane's request: None (its first) or the ``{"lease", "record"}`` it hands in."""
    _fields("request", message, {"done"})
    done = message["done"]
    if done is None:
        return None
    if not isinstance(done, dict):
        raise LaneProtocolError(f"done: got {_short(repr(done), 80)}, expected null or "
                                "{lease, record}")
    _fields("done", done, {"lease", "record"})
    _text("lease", done["lease"], _HEX, LEASE_HEX)
    if not isinstance(done["record"], str):
        raise LaneProtocolError("done.record: expected a record's JSON text")
    return done


def check_answer(message: dict) -> Optional[dict]:
    """The driver's answer: None (no case: the lane ends) or ``{case, id, attempt, lease}``;
    a refusal raises :class:`LaneRefused`."""
    if set(message) == {"refused"}:
        raise LaneRefused(f"refused by the driver: {_short(str(message['refused']), 300)}")
    if message == {"case": None}:
        return None
    _fields("answer", message, {"case", "id", "attempt", "lease"})
    if not isinstance(message["case"], dict) or not isinstance(message["id"], str):
        raise LaneProtocolError("answer: case must be an object and id a string")
    attempt = message["attempt"]
    if not (isinstance(attempt, int) and not isinstance(attempt, bool) and attempt >= 1):
        raise LaneProtocolError(f"answer.attempt: got {_short(repr(attempt), 40)}, expected a "
                                "positive integer")
    _text("lease", message["lease"], _HEX, LEASE_HEX)
    return message


# -- the lane's end ----------------------------------------------------------------------------

def parse_address(address: str) -> tuple[str, str, int]:
    """``tcp://host:port`` or ``tls://[v6]:port`` -> (scheme, host, port)."""
    scheme, sep, rest = address.partition("://")
    host, _, port = rest.rpartition(":")
    if not sep or scheme not in ("tcp", "tls") or not host or not port.isdigit():
        raise ValueError(f"lane address: got {_short(repr(address), 80)}, expected "
                         "tcp://host:port or tls://host:port")
    return scheme, host.strip("[]"), int(port)


class LaneChannel:
    """A lane's connection to its driver (blocking: the lane runs in a worker thread)."""

    def __init__(self, sock: socket.socket, session: Session):
        self.sock, self.session = sock, session

    @classmethod
    def open(cls, address: str, run: str, lane: str, key: bytes,
             ssl_context: Optional[ssl.SSLContext], timeout_s: float) -> "LaneChannel":
        """Connect and authenticate both ways. Raises OSError (unreachable) or
        :class:`LaneProtocolError` (refused, or not our driver); :class:`LaneBusy` when the
        driver's port was full (it said so, or closed the connection before its hello)."""
        scheme, host, port = parse_address(address)
        sock = socket.create_connection((host, port), timeout=timeout_s)
        try:
            if scheme == "tls":
                if ssl_context is None:
                    raise LaneProtocolError("the driver listens with TLS and this worker has "
                                            "no TLS certificate")
                try:
                    sock = ssl_context.wrap_socket(sock)
                except _CUT as exc:
                    raise LaneBusy(f"the driver closed the connection in its TLS handshake "
                                   f"({type(exc).__name__}): its lane port is full") from None
            try:
                first = decode(_read_frame(sock, MAX_HANDSHAKE_FRAME))
            except _CUT as exc:
                raise LaneBusy(f"the driver closed the connection before its hello "
                               f"({type(exc).__name__}): its lane port is full") from None
            if set(first) == {"refused"} and str(first["refused"]).startswith(BUSY):
                raise LaneBusy(f"refused by the driver: {_short(str(first['refused']), 300)}")
            hello = check_hello(first)
            if hello["run"] != run:
                raise LaneProtocolError(f"the driver at {address} runs {hello['run']}, not "
                                        f"{run}")
            nd, nl = hello["nonce"], secrets.token_hex(NONCE_BYTES)
            sock.sendall(frame(encode({"lane": lane, "nonce": nl,
                                       "proof": lane_proof(key, run, lane, nd, nl)})))
            try:
                reply = decode(_read_frame(sock, MAX_HANDSHAKE_FRAME))
            except _CUT as exc:  # cut for room before its proof was checked: its key unspent
                raise LaneBusy(f"the driver closed the connection in the handshake "
                               f"({type(exc).__name__}): its lane port is full") from None
            if set(reply) == {"refused"}:
                check_answer(reply)
            _fields("welcome", reply, {"proof"})
            if not (isinstance(reply["proof"], str)
                    and proofs_match(driver_proof(key, run, lane, nd, nl), reply["proof"])):
                raise LaneProtocolError(f"the listener at {address} could not prove it is "
                                        "this run's driver")
            return cls(sock, Session(key, run, lane, nd, nl, side="lane"))
        except BaseException:
            sock.close()
            raise

    def ask(self, request: dict, timeout_s: float) -> Optional[dict]:
        """Send a request, return the driver's answer (:func:`check_answer`)."""
        self.sock.sendall(frame(self.session.seal(request)))
        self.sock.settimeout(timeout_s)
        return check_answer(self.session.open(_read_frame(self.sock, MAX_FRAME)))

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _read_frame(sock: socket.socket, limit: int) -> bytes:
    length = frame_length(_read_exactly(sock, _LENGTH.size), limit)
    return _read_exactly(sock, length)


def _read_exactly(sock: socket.socket, count: int) -> bytes:
    chunks, got = [], 0
    while got < count:
        chunk = sock.recv(min(count - got, 1 << 20))
        if not chunk:
            raise ConnectionResetError("the driver closed the connection")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
