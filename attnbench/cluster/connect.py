"""Dask: where cases run. An embedded LocalCluster by default, a running scheduler
(``--scheduler``), or SLURM jobs (``--cluster slurm``, dask-jobqueue).

Routing: every worker advertises ``device=N`` and ``kind-<KIND>=N`` (see
:mod:`attnbench.cluster.worker`); a case is submitted with the resources it needs
(:func:`plan_case`), and one that no worker can ever satisfy is reported at once instead of
waiting in Dask's ``no-worker`` state forever.

The task a worker runs for one case is :mod:`attnbench.cluster.task`; what a worker owns (its
lease table, its rank pools) is a worker plugin, registered here on every connection
(:mod:`attnbench.cluster.plugin`).
"""

from __future__ import annotations

import collections
import importlib.util
import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional

from attnbench.cluster.task import CPU_RANKS_PER_SLOT
from attnbench.errors import ClusterError, UsageError, short_repr
from attnbench.resources import CPU_KIND, DEVICE, ENV_PREWARM, KIND_PREFIX, case_resources
from attnbench.sweep.case import Case

log = logging.getLogger("attnbench")

# -- what the workers offer, what a case needs -------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    address: str
    name: str
    resources: Mapping[str, float] = field(default_factory=dict)

    @property
    def devices(self) -> int:
        return int(self.resources.get(DEVICE, 0))

    @property
    def kinds(self) -> list[str]:
        """Every kind it advertises: the exact one and its family (kind-H100-SXM5-80GB and
        kind-H100)."""
        return [k[len(KIND_PREFIX):] for k in self.resources if k.startswith(KIND_PREFIX)]

    @property
    def kind(self) -> Optional[str]:
        """The exact kind (the longest name advertised)."""
        return max(self.kinds, key=len) if self.kinds else None

    def offers(self, resources: Mapping[str, float]) -> bool:
        return all(self.resources.get(k, 0) >= v for k, v in resources.items())


def describe_workers(workers: Iterable[WorkerInfo]) -> str:
    """``1 x A with 1 device, 2 x H100 with 8 devices``."""
    groups: collections.Counter = collections.Counter()
    plain = 0
    for w in workers:
        if w.kind is None or not w.devices:
            plain += 1
        else:
            groups[(w.kind, w.devices)] += 1
    parts = [f"{n} x {kind} with {d} device{'s' if d != 1 else ''}"
             for (kind, d), n in sorted(groups.items())]
    if plain:
        parts.append(f"{plain} without attnbench resources (start workers with "
                     "`attnbench worker`)")
    return ", ".join(parts) or "none connected"


def plan_case(case: Case, workers: Iterable[WorkerInfo]) -> tuple[Optional[dict], str]:
    """The resources to submit ``case`` with, or None and why no worker can run it.

    A case needs ``cp * tp`` units of its kind on one worker. On CPU workers a case with more
    ranks than the largest worker has slots still runs, its ranks sharing that worker's slots
    (ranks are processes; timing is then of an oversubscribed CPU, which the lease records),
    up to :data:`CPU_RANKS_PER_SLOT` ranks per slot."""
    workers = list(workers)
    need = case.world_size
    wanted = case_resources(case.gpu, need)
    if any(w.offers(wanted) for w in workers):
        return wanted, ""
    cpu_slots = [w.devices for w in workers if w.kind == CPU_KIND and w.devices]
    if case.gpu in ("any", CPU_KIND) and cpu_slots:
        slots = max(cpu_slots)
        if need <= CPU_RANKS_PER_SLOT * slots:
            return case_resources(CPU_KIND, slots), ""
        return None, (f"cp={case.cp} x tp={case.tp} needs {need} ranks; the largest CPU worker "
                      f"has {slots} slot{'s' if slots != 1 else ''} and runs at most "
                      f"{CPU_RANKS_PER_SLOT} ranks per slot (start it with more --slots)")
    where = describe_workers(workers)
    if not workers:
        return None, "no workers connected"
    if case.gpu != "any" and not any(case.gpu in w.kinds for w in workers):
        return None, f"no worker offers GPU kind {case.gpu!r} (workers: {where})"
    largest = max((w.devices for w in workers if case.gpu == "any" or case.gpu in w.kinds),
                  default=0)
    kind = "" if case.gpu == "any" else f" of kind {case.gpu}"
    return None, (f"cp={case.cp} x tp={case.tp} needs {need} devices{kind} on one worker; the "
                  f"largest offers {largest} (workers: {where})")


# -- connecting --------------------------------------------------------------------------------


@dataclass
class Connection:
    client: object
    cluster: Optional[object]
    slots: int
    """Devices (GPUs or CPU slots) over all workers when connected."""
    where: str = ""
    """One line for the user: the scheduler's address or the embedded cluster."""
    keeper: Optional[object] = None
    """The embedded cluster's :class:`~attnbench.cluster.keeper.WorkerKeeper` (None elsewhere:
    other workers can run the cases, or come back)."""

    @property
    def dashboard(self) -> str:
        """Where Dask's dashboard is, for the run's first line; a scheduler hardened with
        ``--preload attnbench.cluster.closed_http`` serves none, and Dask's
        ``client.dashboard_link`` raises ``KeyError: 'dashboard'`` for it (issue 41, item 4)."""
        try:
            link = self.client.dashboard_link
        except KeyError:
            link = None
        return link or "none (the scheduler serves no HTTP port)"

    def workers(self) -> list[WorkerInfo]:
        info = self.client.scheduler_info(n_workers=-1)
        return [WorkerInfo(address, str(w.get("name", address)), dict(w.get("resources") or {}))
                for address, w in info.get("workers", {}).items()]

    def close(self) -> None:
        try:
            self.client.close(timeout=10)
        except Exception:  # noqa: BLE001
            # A client whose scheduler died can fail to close (over TLS: "IOStream is not idle;
            # cannot convert to SSL" from its reconnect attempt): the run's own error, already
            # reported, is the one the user needs, not this one.
            pass
        finally:
            if self.cluster is not None:
                self.cluster.close()


_ADDRESS = re.compile(r"(?:(?P<scheme>[a-z]+)://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)"
                      r"(?::(?P<port>[0-9]{1,5}))?")
SCHEMES = ("tcp", "tls", "ucx", "ws", "wss")


SLURM_NEEDS = "--cluster slurm needs dask-jobqueue >= 0.9: pip install 'attnbench[slurm]'"


def check_connection_arguments(scheduler: Optional[str], cluster: Optional[str],
                               security) -> None:
    """What ``connect`` would refuse, checked before a run directory is made (exit 2)."""
    if scheduler and cluster:
        raise UsageError("give either --scheduler or --cluster, not both")
    if cluster not in (None, "local", "slurm"):
        raise UsageError(f"--cluster: got {short_repr(cluster)}, expected local or slurm")
    if scheduler is not None:
        match = _ADDRESS.fullmatch(scheduler)
        if (match is None or (match["scheme"] or "tcp") not in SCHEMES
                or (match["port"] and not 0 < int(match["port"]) < 65536)):
            raise UsageError(f"--scheduler: got {short_repr(scheduler)}, expected a Dask "
                             "scheduler address such as tcp://host:8786 or tls://host:8786")
        if match["scheme"] == "tls" and security is None:
            raise UsageError(f"{scheduler} speaks TLS: give --tls-ca-file, --tls-cert and "
                             "--tls-key")
    elif cluster != "slurm" and security is not None:
        raise UsageError("TLS options apply to --scheduler or --cluster slurm; the embedded "
                         "cluster talks over loopback inside this machine")
    if cluster == "slurm" and importlib.util.find_spec("dask_jobqueue") is None:
        raise UsageError(SLURM_NEEDS)  # an install, not a cluster to wait for: exit 2


def make_security(ca_file: Optional[str], cert: Optional[str], key: Optional[str]):
    """A distributed Security for TLS with one certificate for every role (client, scheduler,
    workers), or None when no TLS option is given. A missing option or file is a
    :class:`UsageError` (exit 2)."""
    if not (ca_file or cert or key):
        return None
    missing = [n for n, v in (("--tls-ca-file", ca_file), ("--tls-cert", cert), ("--tls-key", key))
               if not v]
    if missing:
        raise UsageError(f"TLS needs --tls-ca-file, --tls-cert and --tls-key; missing "
                         f"{', '.join(missing)}")
    for path in (ca_file, cert, key):
        if not os.path.isfile(path):
            raise UsageError(f"TLS: {path}: no such file")
    from distributed.security import Security

    return Security(tls_ca_file=ca_file, tls_client_cert=cert, tls_client_key=key,
                    tls_scheduler_cert=cert, tls_scheduler_key=key, tls_worker_cert=cert,
                    tls_worker_key=key, require_encryption=True)


def default_local_slots() -> int:
    """Concurrent cases on the embedded cluster: one per GPU; on CPU one per core."""
    from attnbench.cluster.worker import detect_node

    return len(detect_node().ids)


def connect(scheduler: Optional[str], slots: Optional[int] = None, *,
            cluster: Optional[str] = None, security=None,
            worker_wait_s: float = 60.0) -> Connection:
    """A Dask client: to ``scheduler`` if given, to SLURM jobs if ``cluster == "slurm"``, else
    to a new embedded LocalCluster. ``slots``: concurrent cases on the embedded cluster (GPUs
    used on a GPU machine), the workers to wait for on a scheduler, the jobs to start on SLURM.
    Raises :class:`ClusterError` with a one-line message (:class:`UsageError` for arguments
    that cannot work, see :func:`check_connection_arguments`)."""
    check_connection_arguments(scheduler, cluster, security)
    if scheduler:
        return _connect_scheduler(scheduler, slots or 1, security, worker_wait_s)
    if cluster == "slurm":
        return _connect_slurm(slots or 1, security, worker_wait_s)
    return _connect_local(slots)


def _connect_scheduler(address: str, min_workers: int, security,
                       worker_wait_s: float) -> Connection:
    from distributed import Client

    from attnbench.cluster.plugin import register

    try:
        client = Client(address, timeout="20s", security=security)
    except (OSError, TimeoutError, ValueError, TypeError) as exc:
        raise ClusterError(f"cannot reach the Dask scheduler at {address}: "
                           f"{_one_line(exc)}") from None
    register(client)  # workers someone else started, now and as they join
    conn = Connection(client, None, 1, where=f"scheduler {address}")
    _wait_for_workers(conn, min_workers, worker_wait_s,
                      f"start one per node: attnbench worker --scheduler {address}")
    return conn


def _connect_slurm(jobs: int, security, worker_wait_s: float) -> Connection:
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError:
        raise UsageError(SLURM_NEEDS) from None
    from distributed import Client

    from attnbench.cluster.plugin import register

    kwargs = {"worker_command": "attnbench.cluster.worker", "processes": 1}
    if security is not None:
        kwargs.update(security=security, protocol="tls://")
    try:
        # Queue, account, cores, memory, walltime and --gres come from the jobqueue.slurm
        # section of the Dask configuration (docs/cluster.md).
        cluster = SLURMCluster(**kwargs)
    except (ValueError, TypeError) as exc:
        raise ClusterError(f"--cluster slurm: {_one_line(exc)} (configure jobqueue.slurm, "
                           "see docs/cluster.md)") from None
    cluster.scale(jobs=jobs)
    client = Client(cluster)
    register(client)  # the jobs run `attnbench worker`, which registers it too: idempotent
    conn = Connection(client, cluster, 1,
                      where=f"SLURM ({jobs} job{'s' if jobs != 1 else ''}), scheduler "
                            f"{cluster.scheduler_address}")
    _wait_for_workers(conn, 1, worker_wait_s, "check the jobs with squeue; raise --worker-wait "
                                               "for a busy queue")
    return conn


def _connect_local(slots: Optional[int]) -> Connection:
    import dask
    from distributed import Client, LocalCluster

    from attnbench.cluster.keeper import WorkerKeeper
    from attnbench.cluster.plugin import register
    from attnbench.cluster.worker import detect_gpus, detect_node

    gpus = detect_gpus()
    if gpus and slots:
        gpus = gpus[:slots]
    node = detect_node(slots=None if gpus else slots, gpus=gpus)
    # Everything on loopback: the scheduler, the worker and the Dask dashboard (":0" would
    # serve the dashboard on every interface while printing 127.0.0.1).
    # The plugin preloaded: the worker sets it up as it starts, before it joins, and starts
    # its rank pools then (ENV_PREWARM), while the client still waits for the cluster.
    with dask.config.set({"distributed.worker.daemon": True}):
        cluster = LocalCluster(n_workers=1, threads_per_worker=len(node.ids), processes=True,
                               host="127.0.0.1", dashboard_address="127.0.0.1:0",
                               silence_logs=logging.ERROR, resources=node.resources,
                               env={**node.environ(),
                                    ENV_PREWARM: os.environ.get(ENV_PREWARM, "1")},
                               preload=["attnbench.cluster.plugin"])
    client = Client(cluster)
    register(client)
    return Connection(client, cluster, len(node.ids),
                      where=f"embedded LocalCluster ({len(node.ids)} concurrent cases, "
                            f"{node.describe()})", keeper=WorkerKeeper(cluster, client))


def _wait_for_workers(conn: Connection, count: int, wait_s: float, hint: str) -> None:
    """At least ``count`` workers, then until none has joined for a second (workers started
    together register within a second or two of each other), at most 10 s."""
    try:
        conn.client.wait_for_workers(count, timeout=wait_s)
    except TimeoutError:
        have = len(conn.workers())
        conn.close()
        raise ClusterError(f"{have} of {count} worker(s) connected to the {conn.where} after "
                           f"{wait_s:g} s; {hint}") from None
    seen, since, deadline = None, time.monotonic(), time.monotonic() + 10
    while time.monotonic() < deadline:
        now = {w.address for w in conn.workers()}
        if now != seen:
            seen, since = now, time.monotonic()
        elif time.monotonic() - since >= 1.0:
            break
        time.sleep(0.2)
    conn.slots = max(1, sum(w.devices for w in conn.workers()))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"
