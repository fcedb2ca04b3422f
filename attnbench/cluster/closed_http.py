"""A Dask preload that closes the HTTP port Dask opens whatever ``--no-dashboard`` says.

``dask worker --no-dashboard`` and ``dask scheduler --no-dashboard`` leave out the Bokeh pages
only: ``ServerNode.start_http_server`` runs unconditionally (distributed 2026.8), so a worker
still answers ``/health`` and ``/metrics`` and a scheduler ``/info/main/workers.html`` and
``/json`` on every interface (issue #25, item 8, measured with ``ss -ltnp``). Loaded with
``--preload attnbench.cluster.closed_http`` (``attnbench worker --no-dashboard`` adds it), it
stops that server before the worker registers with its scheduler, so the port is closed and no
dashboard port is announced. Between Dask's ``listen`` and this preload (milliseconds) the
server is on 127.0.0.1 with no routes: ``attnbench worker`` passes both with it.
"""

from __future__ import annotations

__all__ = ["ROUTES_ENV", "dask_setup"]

ROUTES_ENV = "DASK_DISTRIBUTED__WORKER__HTTP__ROUTES"
"""Dask's list of HTTP handler modules for a worker, from the environment: ``[]`` serves 404 for
every path while the server is still open."""


def dask_setup(server) -> None:
    """``server``: the Worker or Scheduler the preload runs in (the Nanny has no HTTP server)."""
    http_server = getattr(server, "http_server", None)
    if http_server is not None:
        http_server.stop()  # tornado: stop listening; a second stop (at close) does nothing
    server.services.pop("dashboard", None)  # announced to the scheduler at registration
