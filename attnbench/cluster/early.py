"""A cluster started in the background while ``run`` makes its run directory (issue 40, item
9): the smoke run's first record came 19 s after the command, 7.8 s of them the embedded
cluster's start, which waited for everything before it.

``run`` starts it as soon as it knows cases will run -- a fresh run directory holds every case
of a valid sweep -- and takes it when it needs it (:meth:`EarlyConnection.get`); a run that
stops before (the directory refused, nothing pending) closes it (:meth:`discard`). A resumed
run reads its journal first: a finished run starts no cluster for nothing.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

from attnbench.cluster.connect import Connection


class EarlyConnection:
    """``start()`` (a :func:`~attnbench.cluster.connect.connect`) in a thread, begun now."""

    def __init__(self, start: Callable[[], Connection]):
        self._start = start
        self._conn: Optional[Connection] = None
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._connect, name="attnbench-connect",
                                        daemon=True)
        self._thread.start()

    def _connect(self) -> None:
        try:
            self._conn = self._start()
        except BaseException as exc:  # noqa: BLE001 -- raised again where it is taken
            self._error = exc

    def get(self) -> Connection:
        """The connection, once up, now the caller's to close; what it raised (a
        ClusterError) raised here."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        conn, self._conn = self._conn, None
        return conn

    def discard(self) -> None:
        """Not needed after all: wait for it, then close it. Never raises."""
        self._thread.join()
        if self._conn is not None:
            self._conn.close()
            self._conn = None
