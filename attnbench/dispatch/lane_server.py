"""The driver's end of the lanes: a listener on a thread and event loop of its own, speaking
:mod:`~.lane_wire` and nothing else.

Each connection must prove within :data:`HANDSHAKE_S` that it holds the key of a lane of this
run that has not connected yet; then it may ask for a case and hand in the record of the one
it holds, each request checked by its handler (:class:`~attnbench.dispatch.lanes.LaneRun`).
Anything else -- a stranger, a stale or forged key, a second connection on a live key, a
frame too large, malformed, altered or replayed -- ends the connection with one log line (the
first :data:`LOGGED_REFUSALS`, then a count) and a one-line refusal to the peer; nothing it
sent is run or journaled.

Its own loop, not the Dask client's: nothing here depends on Dask (the protocol is tested
without a cluster), and a driver running inside a worker (``submit``) keeps lane traffic off
the worker's event loop and its heartbeats.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import ssl
import threading
from dataclasses import dataclass
from typing import Optional, Protocol

from attnbench.dispatch.lane_wire import (MAX_FRAME, MAX_HANDSHAKE_FRAME, NONCE_BYTES, PROTO,
                                          VERSION, LaneProtocolError, Session, check_auth,
                                          check_request, decode, driver_proof, encode, frame,
                                          frame_length, lane_proof, proofs_match)

log = logging.getLogger("attnbench")

HANDSHAKE_S = 30.0
"""A genuine lane answers the hello at once (its first action); 30 s covers a worker on a box
at load 13 on 2 cores (issue #25, item 13) and bounds how long a silent stranger holds a
connection open."""
MAX_UNPROVEN = 512
"""Connections still in their handshake at once: twice the 256 devices whose lanes connect
together at the scale target, half of the usual 1,024 open-file limit, so strangers cannot
exhaust the driver's files; beyond it a connection is closed at once."""
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
        self.unproven = 0
        self.refused = 0
        self.first_refusal = ""

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
        return await asyncio.start_server(
            self._serve, self.host, 0, ssl=self.ssl_context,
            ssl_handshake_timeout=HANDSHAKE_S if self.ssl_context else None)

    async def _close(self) -> None:
        self.server.close()
        for conn in list(self.conns):
            conn.transport.abort()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=STOP_WAIT_S)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        conn = LaneConn(peer=f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer),
                        transport=writer.transport)
        if self.unproven >= MAX_UNPROVEN:
            self._refuse(conn, f"over {MAX_UNPROVEN} connections in their handshake")
            writer.transport.abort()
            return
        task = asyncio.current_task()
        self.tasks.add(task)
        self.conns.add(conn)
        session: Optional[Session] = None
        try:
            self.unproven += 1
            try:
                session = await asyncio.wait_for(self._handshake(conn, reader, writer),
                                                 HANDSHAKE_S)
            except asyncio.TimeoutError:
                raise LaneProtocolError(f"no handshake within {HANDSHAKE_S:g} s") from None
            finally:
                self.unproven -= 1
            while True:
                done = check_request(session.open(await _read(reader, MAX_FRAME)))
                writer.write(frame(session.seal(self.handler.lane_request(conn, done))))
                await writer.drain()
        except LaneProtocolError as exc:
            await self._refused(conn, writer, session, str(exc))
        except _Closed:
            pass  # the lane ended, its worker died, or the run stopped
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass  # cut: aborted by the driver, or reset by the peer
        except Exception as exc:  # noqa: BLE001 -- a bug here must not leave a case in limbo
            await self._refused(conn, writer, session,
                                f"driver error {type(exc).__name__}: {str(exc)[:200]}")
        finally:
            self.conns.discard(conn)
            self.tasks.discard(task)
            try:
                self.handler.lane_closed(conn)
            finally:
                writer.transport.abort()

    async def _handshake(self, conn: LaneConn, reader, writer) -> Session:
        nd = secrets.token_hex(NONCE_BYTES)
        writer.write(frame(encode({"proto": PROTO, "v": VERSION, "run": self.run,
                                   "nonce": nd})))
        await writer.drain()
        auth = check_auth(decode(await _read(reader, MAX_HANDSHAKE_FRAME)))
        lane, nl = auth["lane"], auth["nonce"]
        key = self.handler.lane_key(lane)
        if not proofs_match(lane_proof(key, self.run, lane, nd, nl), auth["proof"]):
            raise LaneProtocolError(f"a wrong proof for {lane} (a stale or forged key)")
        self.handler.lane_connected(conn, lane)
        writer.write(frame(encode({"proof": driver_proof(key, self.run, lane, nd, nl)})))
        await writer.drain()
        return Session(key, self.run, lane, nd, nl, side="driver")

    async def _refused(self, conn: LaneConn, writer, session: Optional[Session],
                       reason: str) -> None:
        """Log it, tell the peer in one line (sealed once a session exists), hang up."""
        conn.refusal = reason
        self._refuse(conn, reason)
        message = {"refused": reason[:300]}
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
