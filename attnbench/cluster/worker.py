"""``attnbench worker``: one Dask worker per node, its devices advertised and leased.

Resources (the names a case asks for when it is submitted, see :func:`case_resources`)::

    device=N        N exclusive units: the node's GPUs, or on a CPU-only node N slots
    kind-<K>=N      the same N units under their kind: kind-H100, kind-A100, kind-cpu

A case with ``gpu: H100`` and ``cp * tp = 4`` asks for ``{"device": 4, "kind-H100": 4}``; a case
with ``gpu: any`` asks for ``{"device": 4}``. Asking for both keeps Dask's count of free
``device`` units exact whatever mix of cases runs. Dask counts free units but does not say
which: :class:`DeviceLeases` (one per worker process, held by the worker's plugin,
:mod:`attnbench.cluster.plugin`) hands concrete device ids to each running case, so two cases
never share a GPU, and the rank pool gets them as ``CUDA_VISIBLE_DEVICES``.

``attnbench worker --scheduler tcp://head:8786`` detects the GPUs without initialising CUDA in
this process (``nvidia-smi``, else torch in a short subprocess), sets the environment the lease
table reads, and replaces itself with ``dask worker --preload attnbench.cluster.plugin`` (the
worker plugin that holds the lease table and the rank pools; nanny, TLS, ``--death-timeout``
and every other ``dask worker`` option keep working: unknown options are passed through). A
plain ``dask worker --resources "device=4 kind-H100=4"`` works too: the client registers the
plugin on connect, and its lease table is built from those resources and
``CUDA_VISIBLE_DEVICES``.

``python -m attnbench.cluster.worker ADDRESS ...`` is the same command, for dask-jobqueue's
``worker_command`` (see ``docs/cluster.md``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Iterator, Mapping, Optional, Sequence

from attnbench.cluster.closed_http import ROUTES_ENV
from attnbench.resources import (CPU_KIND, DEVICE, ENV_DEVICE_KIND, ENV_FAMILY, ENV_IDS, ENV_KIND,
                                 ENV_SIMULATE, ENV_THREADS, ENV_TYPE, KIND_PREFIX, node_resources)
from attnbench.validation import positive_int_argument

log = logging.getLogger("attnbench.cluster.worker")

_KIND_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")
PLUGIN_MODULE = "attnbench.cluster.plugin"
CLOSED_HTTP_MODULE = "attnbench.cluster.closed_http"
"""Preloaded by every ``attnbench worker``: it registers the worker plugin as the worker starts."""
_NVIDIA_SMI_TIMEOUT_S = 30.0
_TORCH_PROBE_TIMEOUT_S = 120.0  # importing torch and creating a CUDA context on a busy node


# -- what a node has ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeDevices:
    """The units one worker offers."""

    kind: str
    """Advertised kind (``H100-SXM5-80GB``, ``cpu``, or what ``--kind`` says)."""
    detected_kind: str
    """Kind of the hardware found (``cpu`` on a CPU-only node)."""
    family: str = ""
    """Advertised too, when it differs from the kind (``H100``); empty under ``--kind``."""
    gpu: bool
    """True: ``ids`` are GPUs; False: CPU slots."""
    ids: tuple[str, ...]
    """GPU ids as ``CUDA_VISIBLE_DEVICES`` takes them (index or UUID), or slot numbers."""
    names: tuple[str, ...] = ()
    """Device names, one per GPU (empty for CPU slots)."""
    threads: int = 1
    """torch threads per rank process (the node's cores shared among its units)."""

    @property
    def resources(self) -> dict[str, int]:
        return node_resources(self.kind, len(self.ids), self.family)

    def describe(self) -> str:
        ids = ",".join(self.ids)
        if self.gpu:
            what = f"{len(self.ids)} x {self.detected_kind} ({self.names[0]}), devices {ids}"
        else:
            what = (f"no GPU: {len(self.ids)} CPU slot{'s' if len(self.ids) != 1 else ''}, "
                    f"{self.threads} thread{'s' if self.threads != 1 else ''} per rank")
        if self.kind != self.detected_kind:
            what += f"; advertised as kind {self.kind!r} (--kind)"
        return what

    def environ(self) -> dict[str, str]:
        """Environment of the worker process, read by :meth:`DeviceLeases.from_environment`."""
        return {ENV_IDS: ",".join(self.ids), ENV_TYPE: "gpu" if self.gpu else "cpu",
                ENV_KIND: self.kind, ENV_DEVICE_KIND: self.detected_kind,
                ENV_FAMILY: self.family, ENV_THREADS: str(self.threads)}


class DetectionError(RuntimeError):
    """The node's devices cannot be advertised as they are; the message says what to do."""


def _visible_entries() -> Optional[list[str]]:
    """CUDA_VISIBLE_DEVICES as a list (None when unset; [] when it hides every GPU)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if entries and entries[0] == "-1":
        return []
    return entries


_SMI_FIELDS = "index,uuid,name,memory.total,pci.device_id"


def _nvidia_smi() -> Optional[list[tuple[str, ...]]]:
    """(index, uuid, name, memory, pci device id) of every GPU the driver sees, as nvidia-smi
    prints them; None when nvidia-smi is unusable."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, f"--query-gpu={_SMI_FIELDS}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=_NVIDIA_SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("nvidia-smi failed (%s); asking torch instead", exc)
        return None
    if proc.returncode != 0:
        log.warning("nvidia-smi exited with %d: %s", proc.returncode, proc.stderr.strip()[:200])
        return None
    rows = []
    for line in proc.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 5:  # a name with commas keeps them: the last two fields are numbers
            rows.append((parts[0], parts[1], ",".join(parts[2:-2]), parts[-2], parts[-1]))
    return rows


_TORCH_PROBE = ("import json, torch; n = torch.cuda.device_count(); "
                "print(json.dumps([torch.cuda.get_device_name(i) for i in range(n)]))")


def _torch_probe() -> list[str]:
    """Names of the GPUs torch sees, from a subprocess (CUDA is initialised there, not here)."""
    try:
        proc = subprocess.run([sys.executable, "-c", _TORCH_PROBE], capture_output=True,
                              text=True, timeout=_TORCH_PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("probing GPUs with torch failed: %s", exc)
        return []
    if proc.returncode != 0:
        log.warning("probing GPUs with torch failed: %s",
                    (proc.stderr.strip().splitlines() or ["?"])[-1][:200])
        return []
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _might_have_gpus() -> bool:
    """Without nvidia-smi: is there any sign of a GPU driver worth a torch probe (seconds)?"""
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/kfd", "/proc/driver/nvidia"))


def detect_gpus() -> list[tuple[str, ...]]:
    """(id, name[, memory, pci device id]) of the GPUs this process may use, ids as
    ``CUDA_VISIBLE_DEVICES`` takes them. Never initialises CUDA in this process."""
    visible = _visible_entries()
    if visible == []:
        return []
    rows = _nvidia_smi()
    if rows is not None:
        if visible is None:
            return [(index, *rest) for index, _, *rest in rows]
        found = []
        for entry in visible:
            row = next((r for r in rows if r[0] == entry
                        or (entry.startswith("GPU-") and r[1].startswith(entry))), None)
            if row is None:  # MIG instances and the like: let torch say what it sees
                break
            found.append((entry, *row[2:]))
        else:
            return found
    elif not _might_have_gpus():
        return []
    names = _torch_probe()
    ids = visible if visible is not None else [str(i) for i in range(len(names))]
    return list(zip(ids[:len(names)], names))


def detect_node(kind: Optional[str] = None, slots: Optional[int] = None,
                gpus: Optional[Sequence[tuple[str, ...]]] = None) -> NodeDevices:
    """The units this node offers: its GPUs, else ``slots`` CPU slots (default: one per core),
    each CPU rank single-threaded whatever the slots (``ATTNBENCH_THREADS`` overrides): on 2
    cores the 78-case smoke sweep took 9.0 s with 2 slots x 1 thread and 28.3 s with 1 slot x 2
    threads -- small attention ops gain nothing from intra-op threads, whose OpenMP spin-waits
    cost a busy box 15x a forward's CPU time (docs/compare.md) -- and an ``attnbench worker
    --slots 1`` then times cases as the embedded cluster does (it gave them 2 threads, issue 27).
    ``kind`` overrides the advertised kind (tests use it to pretend several kinds)."""
    from attnbench.hardware import kind_from_name

    if kind is not None and not _KIND_RE.match(kind):
        raise DetectionError(f"--kind: got {kind!r}, expected letters, digits, '_', '.', '+' or "
                             "'-' (it becomes the Dask resource name kind-<KIND>)")
    gpus = detect_gpus() if gpus is None else list(gpus)
    cores = os.cpu_count() or 1
    threads = int(os.environ.get(ENV_THREADS) or 0)  # the user's choice wins
    if gpus:
        found = [kind_from_name(*gpu[1:]) for gpu in gpus]  # (name, memory, pci id)
        kinds = sorted({k.kind for k in found})
        if len(kinds) > 1:
            per_kind = "; ".join(
                f"{k}: CUDA_VISIBLE_DEVICES="
                f"{','.join(gpu[0] for gpu, f in zip(gpus, found) if f.kind == k)}"
                for k in kinds)
            raise DetectionError(f"this node has GPUs of several kinds ({', '.join(kinds)}); "
                                 f"start one worker per kind: {per_kind} attnbench worker ...")
        if slots is not None:
            raise DetectionError("--slots is for CPU-only nodes; choose GPUs with "
                                 "CUDA_VISIBLE_DEVICES")
        if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
            # Inherited by every rank: each Triton kernel would run in the CPU interpreter.
            raise DetectionError("TRITON_INTERPRET=1 is set on a node with GPUs: Triton kernels "
                                 "would run in the CPU interpreter; unset it and start again")
        return NodeDevices(kind=kind or kinds[0], detected_kind=kinds[0], gpu=True,
                           family="" if kind else found[0].family,
                           ids=tuple(gpu[0] for gpu in gpus), names=tuple(gpu[1] for gpu in gpus),
                           threads=threads or max(1, cores // len(gpus)))
    if slots is not None and slots < 1:
        raise DetectionError(f"--slots: got {slots}, expected >= 1")
    slots = slots or cores
    return NodeDevices(kind=kind or CPU_KIND, detected_kind=CPU_KIND, gpu=False,
                       ids=tuple(str(i) for i in range(slots)), threads=threads or 1)


def simulated_node(kind: Optional[str], count: int) -> NodeDevices:
    """``count`` simulated GPUs of ``kind`` (required: a simulated node has no hardware to name
    its kind)."""
    if not kind or not _KIND_RE.match(kind):
        raise DetectionError(f"--simulate-gpus needs --kind KIND (letters, digits, '_', '.', '+' "
                             f"or '-'), got {kind!r}")
    return NodeDevices(kind=kind, detected_kind=kind, gpu=False,
                       ids=tuple(str(i) for i in range(count)), threads=1)


# -- leases inside the worker process ----------------------------------------------------------


class LeaseTimeout(RuntimeError):
    """No devices came free in time (they are held by a case Dask no longer counts)."""


@dataclass(frozen=True, slots=True)
class Lease:
    ids: tuple[str, ...]
    gpu: bool

    def pool_env(self, world_size: int) -> Optional[list[dict[str, str]]]:
        """Per-rank environment for :meth:`PoolSet.lease`: rank r sees only GPU ``ids[r]`` (so
        ``cuda:0`` is its own, as the case runner expects). None for CPU slots: any warm pool
        serves any slot."""
        if not self.gpu:
            return None
        if len(self.ids) != world_size:
            raise ValueError(f"{world_size} ranks need {world_size} GPUs, leased {self.ids}")
        return [{"CUDA_VISIBLE_DEVICES": device} for device in self.ids]


class DeviceLeases:
    """Which of this worker's units each running case holds (Dask only counts them).

    ``lease(n)`` takes ``n`` free ids, preferring an aligned block (ids ``k*n .. k*n+n-1``, the
    NVLink-friendly and pool-friendly choice: the same cases get the same GPUs, so their warm
    pools are reused) and blocks until they are free. Dask normally guarantees they are; they
    are not when a cancelled case still runs (Dask cannot stop a running task). Once closed
    (the worker is closing) nothing more is leased.
    """

    def __init__(self, ids: Sequence[str], *, kind: str, gpu: bool,
                 detected_kind: Optional[str] = None):
        if not ids:
            raise ValueError("a worker needs at least one device or slot")
        self.ids = tuple(ids)
        self.kind = kind
        self.detected_kind = detected_kind or kind
        self.gpu = gpu
        self._free = set(self.ids)
        self._cond = threading.Condition()
        self._closed = False

    def _pick(self, count: int) -> Optional[tuple[str, ...]]:
        for start in range(0, len(self.ids) - count + 1, count):
            block = self.ids[start:start + count]
            if all(d in self._free for d in block):
                return block
        free = [d for d in self.ids if d in self._free]
        return tuple(free[:count]) if len(free) >= count else None

    @contextlib.contextmanager
    def lease(self, count: int, timeout: Optional[float] = None) -> Iterator[Lease]:
        if not 1 <= count <= len(self.ids):
            raise ValueError(f"asked for {count} devices, this worker has {len(self.ids)}")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while (ids := self._pick(count)) is None or self._closed:
                if self._closed:
                    raise LeaseTimeout(f"devices {','.join(self.ids)}: this worker is closing")
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise LeaseTimeout(f"{count} of devices {','.join(self.ids)} not free after "
                                       f"{timeout:g} s (held: {self.held()})")
                self._cond.wait(remaining)
            self._free.difference_update(ids)
        try:
            yield Lease(ids, self.gpu)
        finally:
            with self._cond:
                self._free.update(ids)
                self._cond.notify_all()

    def held(self) -> list[str]:
        return [d for d in self.ids if d not in self._free]

    def close(self) -> None:
        """Lease nothing more; a case waiting for devices gives up now (the worker closes)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @classmethod
    def from_environment(cls, environ: Mapping[str, str],
                         resources: Mapping[str, float]) -> "DeviceLeases":
        """The table of this worker: from ``attnbench worker``'s environment, else from the
        worker's Dask resources (``dask worker --resources "device=4 kind-H100=4"``)."""
        kinds = [k[len(KIND_PREFIX):] for k in resources if k.startswith(KIND_PREFIX)]
        if environ.get(ENV_IDS):
            kind = environ.get(ENV_KIND) or (max(kinds, key=len) if kinds else CPU_KIND)
            return cls(environ[ENV_IDS].split(","), kind=kind, gpu=environ.get(ENV_TYPE) == "gpu",
                       detected_kind=environ.get(ENV_DEVICE_KIND))
        count = int(resources.get(DEVICE, 0))
        # An exact kind and its family (kind-H100-SXM5-80GB, kind-H100): the longer is exact.
        kind = max(kinds, key=len) if kinds else CPU_KIND
        gpu = kind != CPU_KIND
        visible = [e.strip() for e in environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
                   if e.strip()]
        ids = visible[:count] if gpu and len(visible) >= count else [str(i) for i in range(count)]
        return cls(ids, kind=kind, gpu=gpu)


# -- the command -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnbench worker",
        description="Start a Dask worker for this node: detect its GPUs, advertise them as "
                    "resources (device=N, kind-<KIND>=N) and run cases in rank pools. Options "
                    "not listed here go to `dask worker` unchanged.",
        epilog="Example: attnbench worker --scheduler tcp://head:8786   (on every node)")
    parser.add_argument("--scheduler", metavar="ADDRESS",
                        help="the Dask scheduler, tcp://host:8786 or tls://host:8786 "
                             "(also accepted as the first argument)")
    parser.add_argument("--kind", help="advertise this kind instead of the detected one "
                                       "(e.g. to pretend two kinds in tests)")
    parser.add_argument("--slots", type=positive_int_argument,
                        help="CPU-only node: concurrent case units (default: one per core)")
    parser.add_argument("--nthreads", type=positive_int_argument,
                        help="Dask task threads (default: the number of devices or slots)")
    parser.add_argument("--name", help="worker name (default: chosen by Dask)")
    parser.add_argument("--host", help="the address the worker listens on and the scheduler "
                                       "reaches it at (default: every interface, announced as "
                                       "this node's address); see docs/cluster.md, Security")
    parser.add_argument("--listen-address", metavar="ADDRESS",
                        help="bind to exactly this address, e.g. tcp://10.0.0.5:9000")
    parser.add_argument("--dashboard-address", metavar="ADDRESS",
                        help="the worker's HTTP dashboard (status, /metrics); default: a random "
                             "port on every interface; 127.0.0.1:0 keeps it on this node")
    parser.add_argument("--no-dashboard", action="store_true",
                        help="open no HTTP port at all (no dashboard, /health or /metrics; "
                             "Dask's own --no-dashboard leaves /health and /metrics open)")
    parser.add_argument("--nanny", action=argparse.BooleanOptionalAction, default=True,
                        help="run the worker under a nanny that restarts it if it dies")
    parser.add_argument("--tls-ca-file", metavar="PEM", help="CA certificate(s) for TLS")
    parser.add_argument("--tls-cert", metavar="PEM", help="this worker's TLS certificate")
    parser.add_argument("--tls-key", metavar="PEM", help="this worker's TLS private key")
    parser.add_argument("--simulate-gpus", type=positive_int_argument, metavar="N",
                        help="offer N simulated GPUs of --kind whose cases sleep instead of "
                             "running (scale tests of the orchestration; "
                             "attnbench/cluster/simulation.py)")
    parser.add_argument("--case-seconds", type=float, default=1.0, metavar="SECONDS",
                        help="with --simulate-gpus: how long each case takes (default 1)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print what was detected and the dask worker command, then exit")
    return parser


def dask_worker_argv(address: str, node: NodeDevices, args: argparse.Namespace,
                     passthrough: Sequence[str]) -> list[str]:
    resources = " ".join(f"{k}={v}" for k, v in node.resources.items())
    argv = [sys.executable, "-m", "distributed.cli.dask_worker", address,
            "--nthreads", str(args.nthreads or len(node.ids)), "--resources", resources,
            "--nanny" if args.nanny else "--no-nanny", "--preload", PLUGIN_MODULE]
    if args.name:
        argv += ["--name", args.name]
    if args.no_dashboard:
        # Dask's flag drops the Bokeh pages only; the preload closes the port itself, and until
        # it runs the server listens on loopback (attnbench.cluster.closed_http).
        argv += ["--no-dashboard", "--preload", CLOSED_HTTP_MODULE]
        if not args.dashboard_address:
            argv += ["--dashboard-address", "127.0.0.1:0"]
    for flag in ("host", "listen_address", "dashboard_address", "tls_ca_file", "tls_cert",
                 "tls_key"):
        value = getattr(args, flag)
        if value:
            argv += ["--" + flag.replace("_", "-"), value]
    return argv + list(passthrough)


def _http_environ(args: argparse.Namespace) -> dict[str, str]:
    """--no-dashboard: no HTTP handlers either, for the moment the port is open."""
    return {ROUTES_ENV: "[]"} if args.no_dashboard else {}


def worker_main(argv: Optional[Sequence[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    address = None
    # dask-jobqueue: `python -m attnbench.cluster.worker ADDR`
    if argv and not argv[0].startswith("-"):
        address = argv.pop(0)
    args, passthrough = build_parser().parse_known_args(argv)
    if passthrough[:1] == ["--"]:
        passthrough = passthrough[1:]
    address = args.scheduler or address
    if not address and not any(a.startswith("--scheduler-file") for a in passthrough):
        print("attnbench worker: error: give the scheduler's address: "
              "attnbench worker --scheduler tcp://host:8786", file=sys.stderr)
        return 2
    try:
        node = (simulated_node(args.kind, args.simulate_gpus) if args.simulate_gpus
                else detect_node(args.kind, args.slots))
    except DetectionError as exc:
        print(f"attnbench worker: error: {exc}", file=sys.stderr)
        return 2
    command = dask_worker_argv(address or "", node, args, passthrough)
    if not address:
        command.remove("")
    what = (f"{len(node.ids)} simulated GPUs of kind {node.kind}, cases take "
            f"{args.case_seconds:g} s" if args.simulate_gpus else node.describe())
    print(f"attnbench worker: {socket.gethostname()}: {what}; resources "
          f"{' '.join(f'{k}={v}' for k, v in node.resources.items())}", file=sys.stderr,
          flush=True)
    if args.dry_run:
        print(shlex.join(command))
        extra = {ENV_SIMULATE: repr(args.case_seconds)} if args.simulate_gpus else {}
        extra.update(_http_environ(args))
        for key, value in {**node.environ(), **extra}.items():
            print(f"{key}={value}")
        return 0
    env = dict(os.environ, **node.environ(), **_http_environ(args))
    if args.simulate_gpus:
        env[ENV_SIMULATE] = repr(max(args.case_seconds, 1e-6))
        # Dask's statistical profiler walks every thread's stack 100 times a second: with 32
        # simulated GPUs it cost 1.3 % of a core per idle worker process, for nothing to see.
        env.setdefault("DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED", "False")
    # Become the dask worker (same pid: a supervisor's signals reach it directly).
    os.execve(sys.executable, command, env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(worker_main())
