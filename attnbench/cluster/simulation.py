"""Simulated GPUs, for testing the orchestration at scale on one box.

``attnbench worker --simulate-gpus 64 --kind H100-SXM5-80GB --case-seconds 1`` is an ordinary
Dask worker advertising 64 devices of that kind; its cases lease devices from the same lease
table as on real GPUs (:class:`attnbench.cluster.worker.DeviceLeases`, held by the worker's
plugin), then sleep for the chosen time instead of computing, and return a plausible record
(verdict ``pass``, reason ``simulated``, timing from the FLOP model at half the kind's peak). A
sleeping case costs a thread, not a core, so one process holds many GPUs. The record also says when
its lease began and ended (``env.lease_start``, ``env.lease_end``, wall-clock seconds), from which a
benchmark checks that no device was ever leased twice at once and how much device time stayed idle.
"""

from __future__ import annotations

import os
import socket
import time

from attnbench.resources import ENV_SIMULATE
from attnbench.results.records import make_record
from attnbench.sweep.case import Case
from attnbench.sweep.flops import case_flops

SIMULATED_TFLOPS = 400.0
"""Throughput the simulated records report: about half an H100's dense bf16 peak."""


def simulated_seconds() -> float:
    """Seconds a simulated case takes on this worker, or 0 when the worker is not simulated."""
    return float(os.environ.get(ENV_SIMULATE) or 0)


def simulate_case(case_dict: dict, attempt: int, devices: int, seconds: float, *,
                  lease_wait_s: float) -> dict:
    """Lease ``devices`` of this worker's simulated GPUs (waiting at most ``lease_wait_s``),
    hold them ``seconds``, return a record."""
    from distributed import get_worker

    from attnbench.cluster.plugin import worker_state

    case = Case.from_dict(case_dict)
    leases = worker_state().leases
    with leases.lease(devices or case.world_size, timeout=lease_wait_s) as lease:
        start = time.time()
        time.sleep(seconds)
        end = time.time()
    fwd_flops, bwd_flops = case_flops(case)
    # The 1:2.5 forward/backward split of the FLOP model, at the simulated throughput.
    fwd_ms = 1e3 * fwd_flops / (SIMULATED_TFLOPS * 1e12)
    bwd_ms = 1e3 * bwd_flops / (SIMULATED_TFLOPS * 1e12)
    timing = {"clock": "simulated", "world_size": case.world_size,
              "flops_fwd": fwd_flops, "flops_bwd": bwd_flops,
              "fwd": {"median_ms": fwd_ms, "q1_ms": fwd_ms, "q3_ms": fwd_ms, "n": 1,
                      "tflops": SIMULATED_TFLOPS, "noisy": False},
              "bwd": {"median_ms": bwd_ms, "q1_ms": bwd_ms, "q3_ms": bwd_ms, "n": 1,
                      "tflops": SIMULATED_TFLOPS, "noisy": False}}
    worker = get_worker()
    env = {"host": socket.gethostname(), "pid": os.getpid(), "simulated": True,
           "device": f"sim:{','.join(lease.ids)}", "gpu_kind": leases.kind,
           "worker": str(worker.name), "worker_kind": leases.kind, "lease": list(lease.ids),
           "lease_start": start, "lease_end": end}
    return make_record(case, verdict="pass", reason="simulated", timing=timing, env=env,
                       duration_s=end - start, wall_s=end - start, attempt=attempt)


def lease_overlaps(records: list[dict]) -> int:
    """How many times a device was leased while its previous lease had not ended, from the
    records' ``env.worker``, ``env.lease``, ``env.lease_start`` and ``env.lease_end``."""
    spans: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for record in records:
        env = record.get("env") or {}
        if env.get("lease_start") is None:
            continue
        for device in env.get("lease") or []:
            spans.setdefault((env.get("worker"), device), []).append(
                (env["lease_start"], env["lease_end"]))
    overlaps = 0
    for device_spans in spans.values():
        device_spans.sort()
        overlaps += sum(1 for (_, end), (start, _) in zip(device_spans, device_spans[1:])
                        if start < end)
    return overlaps
