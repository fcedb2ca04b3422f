"""Dask: where cases run. An embedded LocalCluster by default, or a running scheduler.

The task a worker runs (:func:`run_case_task`) never touches torch: it leases a warm rank pool
(child processes started with Popen, see :mod:`attnbench.execution.pool`) and hands the case
over. A segfault or hang therefore kills a rank process, never the Dask worker, so Dask's
KilledWorker logic is not involved in ordinary case failures.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Optional

from attnbench.records import make_record
from attnbench.spec import Case, RunOptions

CASE_FUNC = "attnbench.execution.case_runner:run_payload"
log = logging.getLogger("attnbench")


def run_case_task(case_dict: dict, options_dict: dict, attempt: int = 1) -> dict:
    """Dask task: run one case in a leased rank pool and always return a record."""
    from attnbench.execution.pool import get_default_poolset

    case = Case.from_dict(case_dict)
    options = RunOptions.from_dict(options_dict)
    t0 = time.perf_counter()
    pools = get_default_poolset()
    if not len(pools):  # first case on this worker: configure the ranks it will start
        pools.threads_per_pool = int(os.environ.get("ATTNBENCH_THREADS", "0")) or None
        pools.preload = (CASE_FUNC.split(":")[0],)  # import torch once, at rank start
    with pools.lease(world_size=case.world_size) as pool:
        outcome = pool.run(CASE_FUNC, {"case": case_dict, "options": options_dict},
                           timeout=options.timeout_s)
    wall = time.perf_counter() - t0
    return outcome_to_record(case, outcome, wall, attempt, options.timeout_s)


def outcome_to_record(case: Case, outcome, wall_s: float, attempt: int, timeout_s: float) -> dict:
    if outcome.kind == "ok":
        record = outcome.result
        record["wall_s"] = wall_s
        record["attempt"] = attempt
        return record
    crash = {"signal": outcome.signal, "exit_code": outcome.exit_code, "rank": outcome.rank,
             "stderr_tail": outcome.stderr_tail, "traceback": outcome.traceback}
    if outcome.kind == "timeout":
        reason = f"no answer after {timeout_s:g} s; rank process group killed"
    elif outcome.kind == "crash":
        reason = (f"rank {outcome.rank} died with {outcome.signal or 'exit code'} "
                  f"({outcome.exit_code})")
        if outcome.signal == "SIGKILL":
            reason += "; killed from outside, possibly the kernel's OOM killer"
    elif outcome.kind == "oom":
        reason = "out of memory: " + _last_line(outcome.traceback or outcome.stderr_tail)
    else:
        reason = "harness error: " + _last_line(outcome.traceback or outcome.stderr_tail)
    verdict = outcome.kind if outcome.kind in ("crash", "timeout", "oom") else "error"
    return make_record(case, verdict=verdict, reason=reason, crash=crash, duration_s=wall_s,
                       wall_s=wall_s, attempt=attempt)


def _last_line(text: Optional[str]) -> str:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


@dataclass
class Connection:
    client: object
    cluster: Optional[object]
    slots: int

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            if self.cluster is not None:
                self.cluster.close()


def default_local_slots() -> int:
    """Concurrent cases on the embedded cluster: one per GPU; on CPU one per core, each rank
    single-threaded. Measured on 2 cores (smoke sweep, 78 cases): 1 slot x 2 threads 62 s,
    2 slots x 1 thread 12 s -- small attention ops gain nothing from intra-op threads."""
    gpus = _visible_gpu_count()
    if gpus:
        return gpus
    return max(1, os.cpu_count() or 1)


def _visible_gpu_count() -> int:
    # Counting without importing torch: the worker process must not initialise CUDA.
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        return len([p for p in os.listdir("/proc/driver/nvidia/gpus")])
    except OSError:
        return 0


def connect(scheduler: Optional[str], slots: Optional[int] = None) -> Connection:
    """A Dask client: to ``scheduler`` if given, else to a new embedded LocalCluster."""
    import dask
    from distributed import Client, LocalCluster

    if scheduler:
        client = Client(scheduler, timeout="20s")
        total = sum(w.get("nthreads", 1) for w in client.scheduler_info()["workers"].values())
        return Connection(client, None, max(1, total))
    slots = slots or default_local_slots()
    threads = max(1, (os.cpu_count() or 1) // slots)
    # Each rank process gets its share of the cores; set before workers start so they inherit.
    os.environ.setdefault("ATTNBENCH_THREADS", str(threads))
    with dask.config.set({"distributed.worker.daemon": True}):
        cluster = LocalCluster(n_workers=1, threads_per_worker=slots, processes=True,
                               dashboard_address=":0", silence_logs=logging.ERROR)
    client = Client(cluster)
    return Connection(client, cluster, slots)
