"""The driver's end of the lanes: a listener on a thread and event loop of its own, speaking
:mod:`~.lane_wire` and nothing else.

Each connection must prove within :data:`HANDSHAKE_S` (its TLS handshake included) that it
holds the key of a lane of this run that has not connected yet; then it may ask for a case and
hand in the record of the one it holds, each request checked by its handler
(:class:`~attnbench.dispatch.lanes.LaneRun`).
Anything else -- a stranger, a stale or forged key, a second connection on a live key, a
frame too large, malformed, altered or replayed -- ends the connection with one log line (the
first :data:`LOGGED_REFUSALS`, then a count) and a one-line refusal to the peer; nothing it
sent is run or journaled.

A connection counts against :func:`unproven_cap` from the moment it is accepted, TLS
handshake included (asyncio's own TLS ran before any handler: 1,089 silent connections without
a certificate were never counted and ran a submitted driver out of files, issue 41 item 2).
When the port is full a newcomer cuts the oldest of them if it has been silent
:data:`EVICT_AFTER_S`, else it is refused as ``busy``; a lane that meets a full port waits and
tries again (:func:`~.lane_wire.LaneChannel.open` raises :class:`~.lane_wire.LaneBusy`), which
is no failure of its worker (item 3).

Its own loop, not the Dask client's: nothing here depends on Dask (the protocol is tested
without a cluster), and a driver running inside a worker (``submit``) keeps lane traffic off
the worker's event loop and its heartbeats.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import secrets
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Optional, Protocol

from attnbench.dispatch.lane_wire import (BUSY, MAX_FRAME, MAX_HANDSHAKE_FRAME, NONCE_BYTES,
                                          PROTO, VERSION, LaneProtocolError, Session,
                                          check_auth, check_request, decode, driver_proof,
                                          encode, frame, frame_length, lane_proof, proofs_match)

log = logging.getLogger("attnbench")

HANDSHAKE_S = 30.0
"""A genuine lane answers the hello at once (its first action); 30 s covers a worker on a box
at load 13 on 2 cores (issue #25, item 13) and bounds how long a silent stranger holds a
connection open."""
MAX_UNPROVEN = 512
"""Connections still in their handshake (TLS included) at once: twice the 256 devices whose
lanes connect together at the scale target, half of the usual 1,024 open-file limit, so
strangers cannot exhaust the driver's files; beyond it a connection is closed at once."""
EVICT_AFTER_S = 1.0
"""On a full port, a newcomer cuts the oldest connection in its handshake once that one is this
old: a genuine lane answers the hello in milliseconds, so under a flood a silent stranger holds
a slot about a second (not :data:`HANDSHAKE_S`), and a lane trying again gets in unless the
attacker opens the whole cap anew every second."""
LOGGED_REFUSALS = 20
"""Refusals logged one line each; after that they are counted (a scanner must not fill the
log), and the run's summary says how many there were."""
STOP_WAIT_S = 10.0
"""How long :meth:`LaneServer.close` waits for the connections' handlers to finish."""


@dataclass(eq=False)
class LaneConn:
    """One connection, changed only by its own handler (and read under the run's lock)."""
    peer: str
    transport: object = None
    lane: object = None
    """The lane it proved to be (its handler's record of it), once it has."""
    case: object = None
    lease: Optional[str] = None
    refusal: Optional[str] = None
    """Why the driver refused it, if it did: its case goes back as a refusal, not a death."""
    streams: Optional[tuple] = None
    """Its reader and writer, once its TLS handshake (if any) is done."""


class LaneHandler(Protocol):
    def lane_key(self, lane: str) -> bytes:
        """The key of ``lane`` if it may connect now, else raise LaneProtocolError."""

    def lane_connected(self, conn: LaneConn, lane: str) -> None:
        """``conn`` proved to be ``lane``: bind them (raise LaneProtocolError if it may not)."""

    def lane_request(self, conn: LaneConn, done: Optional[dict]) -> dict:
        """The answer to a checked request (raise LaneProtocolError to refuse it)."""

    def lane_closed(self, conn: LaneConn) -> None:
        """``conn`` ended: what it held goes back."""


class LaneServer:
    def __init__(self, handler: LaneHandler, host: str, ssl_context: Optional[ssl.SSLContext],
                 run: str):
        self.handler, self.host, self.ssl_context, self.run = handler, host, ssl_context, run
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.thread: Optional[threading.Thread] = None
        self.server = None
        self.conns: set[LaneConn] = set()
        self.tasks: set[asyncio.Task] = set()
        self.unproven: collections.OrderedDict[LaneConn, float] = collections.OrderedDict()
        """Connections in their handshake, oldest first, with when they were accepted."""
        self.refused = 0
        self.busy = 0
        """Of the refused, those turned away or cut because the port was full."""
        self.first_refusal = ""
        self.first_busy = ""

    # -- from the driver's threads -----------------------------------------------------------
    def start(self) -> str:
        """Listen on a free port of ``host``; the address lanes connect to."""
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(self._loop_error)
        self.thread = threading.Thread(target=self.loop.run_forever, name="attnbench-lanes",
                                       daemon=True)
        self.thread.start()
        try:
            self.server = asyncio.run_coroutine_threadsafe(self._listen(), self.loop).result()
        except BaseException:
            self._stop_loop()
            raise
        host, port = self.server.sockets[0].getsockname()[:2]
        host = f"[{host}]" if ":" in host else host
        return f"{'tls' if self.ssl_context else 'tcp'}://{host}:{port}"

    def abort(self, conn: LaneConn) -> None:
        """Cut ``conn`` (its worker left but the connection stayed open)."""
        if self.loop is not None and conn.transport is not None:
            self.loop.call_soon_threadsafe(conn.transport.abort)

    def close(self) -> None:
        """Stop listening, cut every connection, wait for their handlers, end the thread."""
        if self.loop is None or self.loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(STOP_WAIT_S)
        except Exception as exc:  # noqa: BLE001 -- closing must not raise over the run's end
            log.warning("lanes: closing the listener: %s: %s", type(exc).__name__, exc)
        self._stop_loop()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(STOP_WAIT_S)
        if not self.thread.is_alive():
            self.loop.close()

    # -- on the listener's loop ----------------------------------------------------------------
    async def _listen(self):
        # No ssl= here: asyncio would run the TLS handshake before any handler, uncounted;
        # _accepted counts the connection, then _serve starts TLS within the handshake's
        # deadline. Not start_server either: its reader reads before TLS starts, and what it
        # read (a ClientHello) is lost to the handshake, which then hangs.
        return await asyncio.get_running_loop().create_server(lambda: _Accepted(self),
                                                              self.host, 0)

    async def _close(self) -> None:
        self.server.close()
        for conn in list(self.conns):
            conn.transport.abort()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=STOP_WAIT_S)

    def _accepted(self, transport) -> None:
        """A new connection (reading paused): counted, or refused at once if the port is
        full."""
        peer = transport.get_extra_info("peername")
        conn = LaneConn(peer=f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer),
                        transport=transport)
        if not self._admit(conn):
            self._full(conn, f"{BUSY}over {len(self.unproven)} connections in their handshake")
            if self.ssl_context is None:  # in clear, the lane reads why; over TLS it sees the
                transport.write(frame(encode({"refused": f"{BUSY}the lane port is full"})))
                transport.close()         # (close after these ~50 bytes: abort drops them)
            else:                         # connection close before the hello: the same to it
                transport.abort()
            return
        task = self.loop.create_task(self._serve(conn, transport))
        self.tasks.add(task)
        self.conns.add(conn)

    async def _streams(self, conn: LaneConn, transport) -> tuple:
        """The connection's reader and writer, over TLS when the cluster uses it."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        protocol = asyncio.StreamReaderProtocol(reader)
        if self.ssl_context is not None:
            try:
                transport = await loop.start_tls(transport, protocol, self.ssl_context,
                                                 server_side=True,
                                                 ssl_handshake_timeout=HANDSHAKE_S)
            except (ssl.SSLError, OSError) as exc:  # no certificate, not TLS at all, a cut
                raise LaneProtocolError(f"TLS handshake failed ({type(exc).__name__}: "
                                        f"{str(exc)[:160]})") from None
            if transport is None:  # the peer left as the handshake ended (asyncio 3.11)
                raise LaneProtocolError("TLS handshake failed (the peer left)")
            conn.transport = transport
        else:
            transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if self.ssl_context is None:
            transport.resume_reading()
        return reader, asyncio.StreamWriter(transport, protocol, reader, loop)

    async def _serve(self, conn: LaneConn, transport) -> None:
        task = asyncio.current_task()
        session: Optional[Session] = None
        try:
            try:
                session = await asyncio.wait_for(self._handshake(conn, transport), HANDSHAKE_S)
            except asyncio.TimeoutError:
                raise LaneProtocolError(f"no handshake within {HANDSHAKE_S:g} s") from None
            finally:
                self.unproven.pop(conn, None)
            reader, writer = conn.streams
            while True:
                done = check_request(session.open(await _read(reader, MAX_FRAME)))
                writer.write(frame(session.seal(self.handler.lane_request(conn, done))))
                await writer.drain()
        except LaneProtocolError as exc:
            await self._refused(conn, session, str(exc))
        except _Closed:
            pass  # the lane ended, its worker died, or the run stopped
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass  # cut: aborted by the driver, or reset by the peer
        except Exception as exc:  # noqa: BLE001 -- a bug here must not leave a case in limbo
            await self._refused(conn, session,
                                f"driver error {type(exc).__name__}: {str(exc)[:200]}")
        finally:
            self.conns.discard(conn)
            self.tasks.discard(task)
            try:
                self.handler.lane_closed(conn)
            finally:
                conn.transport.abort()  # the TLS transport once there is one

    def _admit(self, conn: LaneConn) -> bool:
        """Count ``conn`` among those in their handshake, cutting the oldest if the port is
        full and it has been there :data:`EVICT_AFTER_S`; False: the port is full."""
        now, cap = time.monotonic(), unproven_cap()
        while len(self.unproven) >= cap:
            oldest, since = next(iter(self.unproven.items()))
            if now - since < EVICT_AFTER_S:
                return False
            del self.unproven[oldest]
            oldest.refusal = "cut for room"  # its handler ends on the cut, refused once
            self._full(oldest, f"{BUSY}cut after {now - since:.1f} s in its handshake: the port "
                               f"was full ({cap} connections) and another came")
            oldest.transport.abort()
        self.unproven[conn] = now
        return True

    def _full(self, conn: LaneConn, reason: str) -> None:
        self.busy += 1
        if self.busy == 1:
            self.first_busy = f"{reason} (from {conn.peer})"
        self._refuse(conn, reason)

    async def _handshake(self, conn: LaneConn, transport) -> Session:
        reader, writer = conn.streams = await self._streams(conn, transport)
        nd = secrets.token_hex(NONCE_BYTES)
        writer.write(frame(encode({"proto": PROTO, "v": VERSION, "run": self.run,
                                   "nonce": nd})))
        await writer.drain()
        auth = check_auth(decode(await _read(reader, MAX_HANDSHAKE_FRAME)))
        lane, nl = auth["lane"], auth["nonce"]
        key = self.handler.lane_key(lane)
        if not proofs_match(lane_proof(key, self.run, lane, nd, nl), auth["proof"]):
            raise LaneProtocolError(f"a wrong proof for {lane} (a stale or forged key)")
        self.unproven.pop(conn, None)  # proven: never cut for room, its key is spent now
        self.handler.lane_connected(conn, lane)
        writer.write(frame(encode({"proof": driver_proof(key, self.run, lane, nd, nl)})))
        await writer.drain()
        return Session(key, self.run, lane, nd, nl, side="driver")

    async def _refused(self, conn: LaneConn, session: Optional[Session], reason: str) -> None:
        """Log it, tell the peer in one line (sealed once a session exists), hang up."""
        if conn.refusal is not None:  # cut for room: refused, counted and logged then
            return
        conn.refusal = reason
        self._refuse(conn, reason)
        message = {"refused": reason[:300]}
        writer = conn.streams[1] if conn.streams else None
        if writer is None or conn.transport.is_closing():  # a failed TLS handshake: no
            return                                         # channel to say it on
        try:
            writer.write(frame(session.seal(message) if session else encode(message)))
            await asyncio.wait_for(writer.drain(), 1.0)  # best effort: the peer may be gone
        except Exception:  # noqa: BLE001
            pass

    def _refuse(self, conn: LaneConn, reason: str) -> None:
        self.refused += 1
        who = f"{conn.peer}{f' ({conn.lane.key})' if conn.lane is not None else ''}"
        if self.refused == 1:
            self.first_refusal = f"{reason} (from {who})"
        if self.refused <= LOGGED_REFUSALS:
            log.warning("attnbench lanes: refused a connection from %s: %s", who, reason)
        elif self.refused == LOGGED_REFUSALS + 1:
            log.warning("attnbench lanes: more refused connections are counted, not logged")

    def _loop_error(self, loop, context: dict) -> None:
        """What asyncio would log with a traceback (a peer that vanished mid-TLS-handshake):
        one line."""
        exc = context.get("exception")
        log.warning("attnbench lanes: %s%s", context.get("message", "error"),
                    f" ({type(exc).__name__}: {str(exc)[:200]})" if exc else "")


def unproven_cap() -> int:
    """:data:`MAX_UNPROVEN`, or half this process's open-file limit where that is lower (a
    submitted driver shares its worker's)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return MAX_UNPROVEN
    return MAX_UNPROVEN if soft == resource.RLIM_INFINITY else max(2, min(MAX_UNPROVEN,
                                                                          soft // 2))


class _Accepted(asyncio.Protocol):
    """A connection as accepted: reading paused (nothing read before TLS starts), handed to
    :meth:`LaneServer._accepted`, which replaces this protocol."""

    def __init__(self, server: LaneServer):
        self.server = server

    def connection_made(self, transport) -> None:
        transport.pause_reading()
        self.server._accepted(transport)


class _Closed(Exception):
    """The peer closed the connection between frames: the normal end of a lane."""


async def _read(reader: asyncio.StreamReader, limit: int) -> bytes:
    try:
        head = await reader.readexactly(4)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise LaneProtocolError("a frame cut short in its length") from None
        raise _Closed() from None
    length = frame_length(head, limit)
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise LaneProtocolError(f"a frame cut short ({len(exc.partial)} of {length} "
                                "bytes)") from None
