"""Which Dask scheduler ``attnbench run`` talks to, the ways Dask users already say it.

In order: ``--scheduler ADDRESS``; ``--scheduler-file FILE`` (the JSON a scheduler writes with
``dask scheduler --scheduler-file``, how SLURM and MPI deployments hand the address to their
clients; waited for, since the client's job may start before the scheduler's); ``--cluster``;
else Dask's own configuration: ``DASK_SCHEDULER_ADDRESS`` or ``scheduler-address`` in a dask
config file, as ``distributed.Client()`` reads it. None of these: the embedded LocalCluster.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from attnbench.errors import UsageError, short_repr
from attnbench.validation import read_bounded

MAX_SCHEDULER_FILE_BYTES = 4 << 20
"""The largest scheduler file read (4 MiB): Dask writes its identity there when it starts --
address, id, services, and the workers it has then (usually none; about 1 KB each, so this is
thousands); ``/dev/zero`` or a log named by mistake is refused in one line instead of read until
memory runs out."""
POLL_S = 0.5


@dataclass(frozen=True)
class SchedulerChoice:
    address: Optional[str]
    """The scheduler's address, or None for ``--cluster`` or the embedded cluster."""
    source: str
    """Where the address came from, as the user wrote it (``--scheduler-file s.json``)."""


def choose_scheduler(scheduler: Optional[str], scheduler_file: Optional[str],
                     cluster: Optional[str], wait_s: float) -> SchedulerChoice:
    given = [name for name, value in (("--scheduler", scheduler),
                                      ("--scheduler-file", scheduler_file),
                                      ("--cluster", cluster)) if value]
    if len(given) > 1:
        raise UsageError(f"give one of --scheduler, --scheduler-file and --cluster, not "
                         f"{' and '.join(given)}")
    if scheduler:
        return SchedulerChoice(scheduler, "--scheduler")
    if scheduler_file:
        return SchedulerChoice(read_scheduler_file(Path(scheduler_file), wait_s),
                               f"--scheduler-file {scheduler_file}")
    if cluster:
        return SchedulerChoice(None, "--cluster")
    import dask.config  # reads DASK_* variables and ~/.config/dask/*.yaml on import

    address = dask.config.get("scheduler-address", None)
    if address:
        source = ("DASK_SCHEDULER_ADDRESS" if os.environ.get("DASK_SCHEDULER_ADDRESS")
                  else "dask config scheduler-address")
        if not isinstance(address, str):
            raise UsageError(f"{source}: got {short_repr(address)}, expected a Dask scheduler "
                             "address such as tcp://host:8786")
        return SchedulerChoice(address, source)
    return SchedulerChoice(None, "")


def read_scheduler_file(path: Path, wait_s: float) -> str:
    """The ``address`` of a scheduler file, waiting up to ``wait_s`` for it to appear."""
    deadline = time.monotonic() + wait_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(POLL_S)
    try:
        text = read_bounded(path, MAX_SCHEDULER_FILE_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise UsageError(f"{path}: no such scheduler file (waited {wait_s:g} s, --worker-wait); "
                         "expected the file `dask scheduler --scheduler-file` writes") from None
    except (OSError, ValueError) as exc:  # not UTF-8, /dev/zero, a FIFO, over the cap
        raise UsageError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}; "
                         "expected the file `dask scheduler --scheduler-file` writes") from None
    try:
        data = json.loads(text)
    except ValueError:
        raise UsageError(f"{path}: got text that is not JSON, expected the scheduler file "
                         "`dask scheduler --scheduler-file` writes") from None
    address = data.get("address") if isinstance(data, dict) else None
    if not isinstance(address, str) or not address:
        raise UsageError(f"{path}: address: got {short_repr(address)}, expected the "
                         "scheduler's address such as tcp://10.0.0.1:8786")
    return address


def check_choice(choice: SchedulerChoice, cluster: Optional[str], security) -> None:
    """:func:`attnbench.cluster.connect.check_connection_arguments`, its message naming where the
    address came from (``DASK_SCHEDULER_ADDRESS: got 'x', expected ...``)."""
    from attnbench.cluster.connect import check_connection_arguments

    try:
        check_connection_arguments(choice.address, cluster, security)
    except UsageError as exc:
        message = str(exc)
        if choice.source and choice.source != "--scheduler":
            message = message.replace("--scheduler:", f"{choice.source}:", 1)
        raise UsageError(message) from None
