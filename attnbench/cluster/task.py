"""The task a Dask worker runs for one case (:func:`run_case_task`), and the record of what
happened to it.

It never touches torch: it leases devices from the worker's lease table, then a warm rank pool
bound to them (child processes started with Popen, see :mod:`attnbench.execution.pool`), both
held by the worker's plugin (:mod:`attnbench.cluster.plugin`), and hands the case over. A segfault
or hang therefore kills a rank process, never the Dask worker, so Dask's KilledWorker logic only
sees workers that really died (killed, node lost); their cases are rescheduled elsewhere.
"""

from __future__ import annotations

import json
import time
from typing import Optional

from attnbench.errors import BackendError
from attnbench.results.records import make_record
from attnbench.sweep.case import Case
from attnbench.sweep.options import RunOptions

CASE_FUNC = "attnbench.execution.case_runner:run_payload"
"""What a rank runs for one case (its module is what the plugin's ranks import as they start,
:data:`attnbench.cluster.plugin.CASE_RUNNER`)."""

LEASE_GRACE_S = 60.0
"""Beyond a case's own timeout, how long a task waits for devices a cancelled (but still
running) case holds before it gives up."""
CPU_RANKS_PER_SLOT = 4
"""A case may run up to 4 ranks per slot of a CPU worker (ranks are processes; they share the
slots' cores). sweeps/cp_tp.yaml's largest cases (cp=4 x tp=2) run on 2 slots; more ranks per
slot multiply the torch processes (~300 MB each) for no gain in a correctness run. A case
beyond it is refused at planning (``skipped``, "start the worker with more --slots"), before
any rank starts. GPU workers never share a device between ranks."""


# -- the task ----------------------------------------------------------------------------------


def run_case_task(case_dict: dict, options_dict: dict, attempt: int = 1,
                  devices: Optional[int] = None) -> dict:
    """Dask task: lease ``devices`` units (default ``cp * tp``) of this worker, run one case in
    a rank pool bound to them, always return a record."""
    from distributed import get_worker

    from attnbench.cluster.plugin import worker_state
    from attnbench.cluster.simulation import simulate_case, simulated_seconds

    options = RunOptions.from_dict(options_dict)
    if simulated_seconds():  # `attnbench worker --simulate-gpus`: scale tests of orchestration
        return simulate_case(case_dict, attempt, devices, simulated_seconds(),
                             lease_wait_s=options.timeout_s + LEASE_GRACE_S)
    case = Case.from_dict(case_dict)
    t0 = time.perf_counter()
    state = worker_state()
    leases = state.leases
    most = len(leases.ids) * (1 if leases.gpu else CPU_RANKS_PER_SLOT)
    if case.world_size > most:  # a client that did not plan (plan_case): no rank starts
        return make_record(case, verdict="skipped", attempt=attempt, reason=(
            f"cp={case.cp} x tp={case.tp} needs {case.world_size} ranks; this worker runs at "
            f"most {most}"))
    pools = state.pools
    wait_s = options.timeout_s + LEASE_GRACE_S
    with leases.lease(devices or case.world_size, timeout=wait_s) as lease:
        with pools.lease(world_size=case.world_size, env=lease.pool_env(case.world_size)) as pool:
            outcome = pool.run(CASE_FUNC, {"case": case_dict, "options": options_dict},
                               timeout=options.timeout_s,
                               on_compile=compile_teller(get_worker(), case.id))
    wall = time.perf_counter() - t0
    record = outcome_to_record(case, outcome, wall, attempt, options.timeout_s)
    worker = get_worker()
    record["env"] = dict(record.get("env") or {}, lease=list(lease.ids), worker=str(worker.name),
                         worker_kind=leases.kind)
    return record


COMPILE_TOPIC = "attnbench-compile"
"""The Dask event topic of compile news: ``{"case": id, "start": bool}`` when a case's backend
starts and ends compiling; the client's progress line says it
(:meth:`attnbench.dispatch.loop.RunLoop.read_compile_news`)."""


def compile_teller(worker, case_id: str):
    """``on_compile`` of a pool call: a Dask event the client hears (Worker.log_event is safe
    from a task's thread: it hands the message to the worker's loop)."""
    def tell(start: bool) -> None:
        worker.log_event(COMPILE_TOPIC, {"case": case_id, "start": bool(start)})
    return tell


def run_case_task_text(case_dict: dict, options_dict: dict, attempt: int = 1,
                       devices: Optional[int] = None) -> str:
    """:func:`run_case_task`, its record returned as JSON text: Dask measures (``sizeof``) and
    serialises a nested dict field by field, which cost a worker ~4 ms of CPU per case at 256
    simulated GPUs (benchmarks/scale_simulation.py); a string costs next to nothing."""
    return json.dumps(run_case_task(case_dict, options_dict, attempt, devices),
                      separators=(",", ":"))


def outcome_to_record(case: Case, outcome, wall_s: float, attempt: int, timeout_s: float) -> dict:
    if outcome.kind == "ok":
        record = outcome.result
        record["wall_s"] = wall_s
        record["attempt"] = attempt
        return record
    crash = outcome.crash_info()
    if outcome.kind == "timeout":
        reason = f"no answer after {timeout_s:g} s; rank process group killed"
    elif outcome.kind == "crash":
        reason = (f"rank {outcome.rank} died with {outcome.signal or 'exit code'} "
                  f"({outcome.exit_code})")
        if outcome.signal == "SIGKILL":
            reason += "; killed from outside, possibly the kernel's OOM killer"
    elif outcome.kind == "oom":
        reason = "out of memory: " + _last_line(outcome.traceback or outcome.stderr_tail)
    elif outcome.summary.startswith(_BACKEND_ERROR):  # the backend's own, named by its rank
        reason = outcome.summary[len(_BACKEND_ERROR):]
    else:
        reason = "harness error: " + _last_line(outcome.traceback or outcome.stderr_tail)
    verdict = outcome.kind if outcome.kind in ("crash", "timeout", "oom") else "error"
    return make_record(case, verdict=verdict, reason=reason, crash=crash, duration_s=wall_s,
                       wall_s=wall_s, attempt=attempt)


_BACKEND_ERROR = BackendError.__name__ + ": "
"""How a rank's summary of a :class:`~attnbench.errors.BackendError` starts."""


def _last_line(text: Optional[str]) -> str:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
