"""Dask resource names and every ``ATTNBENCH_*`` environment variable, in one place.

Shared by the client, the Dask workers and the rank processes. Imports nothing, so any layer
may use it.

Resources a worker advertises and a case asks for::

    device=N        N exclusive units: the node's GPUs, or on a CPU-only node N slots
    kind-<K>=N      the same N units under their exact kind: kind-H100-SXM5-80GB, kind-cpu
    kind-<F>=N      ... and under their family when it differs: kind-H100

A case with ``gpu: H100-SXM5-80GB`` (or ``gpu: H100``, any H100) and ``cp * tp = 4`` asks for
``{"device": 4, "kind-H100-SXM5-80GB": 4}``; a case with ``gpu: any`` asks for
``{"device": 4}``. Asking for both keeps Dask's count of free ``device`` units exact whatever
mix of cases runs.
"""

from __future__ import annotations

DEVICE = "device"
"""Resource name of one exclusive unit (a GPU, or a CPU slot)."""
KIND_PREFIX = "kind-"
CPU_KIND = "cpu"
DISPATCHES = ("tasks", "lanes")
"""How cases reach the workers (``--dispatch``): a Dask task per case, or a lane per device
that pulls its next case from the driver (:mod:`attnbench.dispatch.lanes`)."""

# -- environment of the worker process, set by `attnbench worker` and the embedded cluster ------
ENV_IDS = "ATTNBENCH_DEVICE_IDS"
"""``0,1,2,3``: the worker's GPU ids as CUDA_VISIBLE_DEVICES takes them (or CPU slot numbers)."""
ENV_TYPE = "ATTNBENCH_DEVICE_TYPE"
"""``gpu`` or ``cpu``."""
ENV_KIND = "ATTNBENCH_KIND"
"""The kind the worker advertises; its rank processes serve cases of that kind."""
ENV_DEVICE_KIND = "ATTNBENCH_DEVICE_KIND"
"""The detected kind (differs from ENV_KIND under ``attnbench worker --kind``)."""
ENV_FAMILY = "ATTNBENCH_FAMILY"
"""The family the worker also advertises (``H100`` for ``H100-SXM5-80GB``; empty if none)."""
ENV_THREADS = "ATTNBENCH_THREADS"
"""torch threads per rank process."""
ENV_PREWARM = "ATTNBENCH_PREWARM"
"""Set (``1``) on the embedded cluster's worker: its plugin starts a one-rank pool per device as
the worker starts, so the first case does not wait for a rank's start (torch's import: 5 s
under load; :mod:`attnbench.cluster.plugin`). ``0`` in the client's environment turns it off
(benchmarks/first_record.py compares)."""
ENV_SIMULATE = "ATTNBENCH_SIMULATE_S"
"""Set by ``attnbench worker --simulate-gpus``: cases sleep this many seconds instead of running
(:mod:`attnbench.cluster.simulation`)."""

# -- environment of a rank process ---------------------------------------------------------------
ENV_DEVICE = "ATTNBENCH_DEVICE"
"""Force the device cases run on (``cpu``, ``cuda:1``); default: cuda:0 if visible, else cpu."""
ENV_POOL_DIR = "ATTNBENCH_POOL_DIR"
"""The rank pool's scratch directory (rendezvous files, logs)."""
ENV_POOL_START = "ATTNBENCH_POOL_START"
"""Start number of the pool's current ranks (a rebuilt pool gets a new one)."""

# -- how our Triton kernels are launched (read at every launch, by attnbench.kernels) -----------
ENV_KERNEL_CONFIGS = "ATTNBENCH_KERNEL_CONFIGS"
"""``autotune`` (default): each launcher autotunes over its tuning space; ``pinned``: one tile
config per kernel (attnbench.kernels.configs.pinned_config), nothing autotuned. Set by the case
runners from the sweep option ``kernel_configs``."""
ENV_FP8_MAX_IMPRECISE_ACC = "ATTNBENCH_FP8_MAX_IMPRECISE_ACC"
"""fp8 forward on sm_90: promote the tensor cores' partial sums into the fp32 accumulator every
N products (tl.dot's ``max_num_imprecise_acc``); 0 or unset: Triton's default (never). Set by
the case runners from the sweep option ``fp8_max_imprecise_acc``."""
KERNEL_CONFIG_MODES = ("autotune", "pinned")


def kind_resource(kind: str) -> str:
    return KIND_PREFIX + kind


def node_resources(kind: str, count: int, family: str = "") -> dict[str, int]:
    """What a worker with ``count`` units of ``kind`` (of ``family``) advertises."""
    resources = {DEVICE: count, kind_resource(kind): count}
    if family and family != kind:
        resources[kind_resource(family)] = count
    return resources


def case_resources(gpu: str, devices: int) -> dict[str, int]:
    """What a case asks for: ``devices`` units, of kind ``gpu`` unless it is ``any``."""
    if gpu == "any":
        return {DEVICE: devices}
    return {DEVICE: devices, kind_resource(gpu): devices}
