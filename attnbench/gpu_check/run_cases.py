"""The speed and accuracy steps: a role's cases through a warm rank pool, one record each into
the result folder's journal -- without Dask (a fresh box may not have it).

The pool is one rank (:class:`attnbench.execution.pool.RankPool`): a kernel that segfaults or
hangs kills that rank, becomes the case's ``crash`` or ``timeout`` record (as a Dask worker's
task makes it: :func:`attnbench.cluster.task.outcome_to_record`), and the next case gets a fresh
rank. A case's timeout is its sweep's ``timeout_s`` cut to what is left of the step, so the step
ends by itself; cases it never reached get their record from the collection.
"""

from __future__ import annotations

import sys
import time
from typing import Optional

from attnbench.cluster.task import CASE_FUNC, outcome_to_record
from attnbench.execution.pool import RankPool
from attnbench.gpu_check.step_main import StepConfig
from attnbench.gpu_check.folder import open_store
from attnbench.gpu_check.sweeps import CheckSweeps, load_check_sweeps
from attnbench.sweep.case import Case
from attnbench.sweep.options import RunOptions

MIN_CASE_S = 10.0
"""Do not start a case with less than this left: a rank's start alone takes seconds."""
CASE_MODULE = CASE_FUNC.partition(":")[0]


def run_speed(config: StepConfig) -> None:
    run_role(config, "speed")


def run_accuracy(config: StepConfig) -> None:
    run_role(config, "accuracy")


def make_pool(config: StepConfig, sweeps: CheckSweeps) -> RankPool:
    """One warm rank, the kernel-config mode in its environment; on a CPU it may use the cores
    (the interpreter is numpy), on a GPU torch's default."""
    return RankPool(world_size=1, env=sweeps.pool_env(),
                    threads=max(1, config.cores) if config.cpu else None,
                    preload=(CASE_MODULE,), start_timeout=max(MIN_CASE_S, config.left_s()))


def run_case(pool: RankPool, case: Case, options: RunOptions, timeout_s: float) -> dict:
    """The case's record, whatever happens to the rank."""
    started = time.perf_counter()
    outcome = pool.run(CASE_FUNC, {"case": case.to_dict(), "options": options.to_dict()},
                       timeout=timeout_s)
    return outcome_to_record(case, outcome, time.perf_counter() - started, 1, timeout_s)


def run_role(config: StepConfig, role: str) -> None:
    sweeps = load_check_sweeps(config.cpu, config.kernel_configs, config.sweeps_dir)
    options = sweeps.options(role)
    store = open_store(config.folder, sweeps)
    try:
        cases = [c for c in sweeps.role(role).cases if c.id not in store.done]
        print(f"{role}: {len(cases)} cases ({sweeps.role(role).path})", flush=True)
        with make_pool(config, sweeps) as pool:
            for number, case in enumerate(cases, 1):
                left = config.left_s()
                if left < MIN_CASE_S:
                    print(f"{role}: {left:.0f} s left of the step: {len(cases) - number + 1} "
                          "cases not started (recorded as skipped by the collection)")
                    break
                record = run_case(pool, case, options, min(options.timeout_s, left))
                store.append(record)
                print(f"{role} {number}/{len(cases)} {progress_line(record)}", flush=True)
    finally:
        store.close()
    sys.stdout.flush()


def progress_line(record: dict) -> str:
    """``verdict  seconds  label  figure``, the figure being what the case is read for."""
    figure = figure_text(record.get("timing"))
    reason = f"  {record.get('reason', '')[:160]}" if record["verdict"] not in (
        "pass", "timed") else ""
    return (f"{record['verdict']:<11} {record.get('wall_s') or 0:6.1f} s  {record['label']}"
            f"{'  ' + figure if figure else ''}{reason}")


def figure_text(timing: Optional[dict]) -> str:
    """``fwd 1.234 ms 456 TFLOP/s  bwd ...`` (GB/s where there are no FLOP/s to speak of)."""
    if not timing:
        return ""
    parts = []
    for direction in ("fwd", "bwd"):
        stats = timing.get(direction)
        if not stats:
            continue
        text = f"{direction} {stats['median_ms']:.3f} ms"
        if stats.get("tflops"):
            text += f" {stats['tflops']:.3g} TFLOP/s"
        if stats.get("gbps") and timing.get("flops_bwd") is None:  # forward only: decode
            text += f" {stats['gbps']:.3g} GB/s"
        parts.append(text)
    return "  ".join(parts)
