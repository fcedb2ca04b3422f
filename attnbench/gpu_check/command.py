"""``attnbench gpu-check``: a fresh GPU box's acceptance check -- this GPU, this software, these
kernels: right, and this fast -- in one command, into one folder.

The driver (this module; no torch, no Dask) prints the plan, starts the clock/power log, runs
each step in its own process under its own timeout (:mod:`~.step_runner`), cut to what is
left of the budget, and always ends with the collection (:mod:`~.collect`). Without CUDA
(or with ``--cpu``) the same steps run at interpreter sizes: the CI rehearsal.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from attnbench.errors import EXIT_FAILURES, EXIT_INTERRUPTED, EXIT_OK, UserError, short_repr
from attnbench.gpu_check.collect import collect_folder, summary_lines, utc_now
from attnbench.gpu_check.costs import CPU, H200
from attnbench.gpu_check.folder import PLAN, open_store
from attnbench.gpu_check.plan import BUDGET_S, COLLECT_RESERVE_S, STEPS, Plan, make_plan
from attnbench.gpu_check.smi_log import SmiLog
from attnbench.gpu_check.step_main import STEP_FUNCS, StepConfig
from attnbench.gpu_check.step_runner import StepResult, run_step
from attnbench.gpu_check.sweeps import KERNEL_CONFIGS, CheckSweeps, load_check_sweeps
from attnbench.results.files import write_atomic


def add_gpu_check_command(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "gpu-check", help="a fresh GPU box's check in minutes: right, and how fast",
        description="Probe the box (NVML identity, matmul peak, SDPA's kernel choices, TF32 "
                    "flags), pre-warm the Triton kernels in parallel, check the timer (eager vs "
                    "CUDA graph), time a sampled speed sweep and judge a small accuracy sweep "
                    "against fp64, logging clocks and power throughout; every step under its "
                    "own timeout, the collection always last. Writes one folder of at most 8 "
                    "files that attnbench show/report/compare read on any machine. Without "
                    "CUDA (or --cpu) the same steps run at interpreter sizes.")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="result folder, new or empty (default results/gpu-check-<UTC time>)")
    p.add_argument("--cpu", action="store_true",
                   help="the CPU variant (chosen by itself when no GPU is visible)")
    p.add_argument("--plan", action="store_true",
                   help="print the plan -- each step's estimate and timeout (on an H200; "
                        "with --cpu on this CPU), the Triton variants -- and exit")
    p.add_argument("--budget", type=float, default=BUDGET_S, metavar="SECONDS",
                   help=f"the whole check's time; steps are cut to fit (default {BUDGET_S:.0f})")
    p.add_argument("--configs", choices=KERNEL_CONFIGS, default="pinned",
                   help="Triton tile configs: pinned (one per kernel, default) or autotune")
    p.add_argument("--sweeps", metavar="DIR",
                   help="folder of the gpu_check_*.yaml sweep files (default: the checkout's)")
    p.set_defaults(func=cmd_gpu_check)


def cmd_gpu_check(args: argparse.Namespace) -> int:
    if not 60 <= args.budget <= 86400:
        raise UserError(f"--budget: got {short_repr(args.budget)}, expected seconds in "
                        "[60, 86400]")
    cpu = args.cpu or (not args.plan and not gpu_visible())
    sweeps = load_check_sweeps(cpu, args.configs, args.sweeps)
    plan = make_plan(sweeps, CPU if cpu else H200, args.budget)
    if args.plan:
        print("\n".join(plan.lines()))
        return EXIT_OK
    status, _ = run_check(args.out or default_folder(), sweeps, plan, sweeps_dir=args.sweeps)
    return status


def gpu_visible() -> bool:
    """Whether a GPU is there for the check: the kernel driver has one (``CUDA_VISIBLE_DEVICES``
    may hide them all) and this Python's torch can use it (a CPU build of torch cannot). Asked
    of a child process: the driver never imports torch, and no CUDA context is made."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return False
    gpus = Path("/proc/driver/nvidia/gpus")
    if not ((gpus.is_dir() and any(gpus.iterdir())) or Path("/dev/nvidia0").exists()):
        return False
    try:
        answer = subprocess.run([sys.executable, "-c", _ASK_CUDA], capture_output=True,
                                text=True, timeout=CUDA_QUESTION_S)
    except subprocess.TimeoutExpired:
        return True  # a driver that slow is a GPU's: the probe step will say more
    return answer.stdout.strip() == "True"


_ASK_CUDA = "import torch; print(torch.cuda.is_available())"
CUDA_QUESTION_S = 60.0
"""Importing torch from a cold page cache, and the driver's first answer."""


def default_folder() -> Path:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return Path("results") / f"gpu-check-{stamp}"


def prepare_folder(folder: Path) -> None:
    """A new or empty folder; anything else is one line, exit 2, nothing written."""
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UserError(f"{folder}: exists and is not an empty folder; gpu-check writes a new "
                        "one (choose another --out)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{folder}: cannot create the result folder: "
                        f"{exc.strerror or exc}") from None


def run_check(folder: Path, sweeps: CheckSweeps, plan: Plan, *, sweeps_dir: Optional[str] = None,
              funcs: Optional[dict[str, str]] = None, warm_module: Optional[str] = None,
              smi_executable: str = "nvidia-smi",
              echo: Callable[[str], None] = print) -> tuple[int, dict]:
    """Run the check into ``folder``: (exit status, summary). ``funcs`` replaces steps'
    functions ("module:function"; tests' stand-ins), ``warm_module`` the pre-warm's module."""
    folder = Path(folder)
    prepare_folder(folder)
    open_store(folder, sweeps).close()  # a run directory from the start: show reads it
    started, t0 = utc_now(), time.monotonic()
    deadline = t0 + plan.budget_s
    funcs = {**STEP_FUNCS, **(funcs or {})}
    write_atomic(folder / PLAN, json.dumps(plan.to_dict(), indent=1))
    for line in plan.lines():
        echo(line)
    config = StepConfig(out=str(folder), cpu=plan.mode == "cpu",
                        kernel_configs=sweeps.kernel_configs, sweeps_dir=sweeps_dir,
                        cores=len(os.sched_getaffinity(0)))
    if warm_module:
        config.warm_module = warm_module
    smi = SmiLog(folder, smi_executable)
    note = smi.start() if plan.mode == "gpu" else "the CPU variant: no clock/power log"
    if note:
        echo(f"gpu-check: {note}")
    results: list[StepResult] = []
    try:
        for name in STEPS[:-1]:
            step = plan.step(name)
            if results and results[-1].status == "interrupted":
                results.append(StepResult(name, "skipped", estimate_s=step.estimate_s,
                                          note="the check was interrupted"))
                continue
            timeout = min(step.timeout_s, deadline - time.monotonic() - COLLECT_RESERVE_S)
            echo(f"gpu-check: {name}: estimate {step.estimate_s:.0f} s, timeout {timeout:.0f} s")
            results.append(run_step(name, funcs[name], config.to_dict(), timeout_s=timeout,
                                    estimate_s=step.estimate_s, echo=echo,
                                    env=sweeps.pool_env()))
    finally:
        smi_summary = smi.stop() if note == "" else {"note": note}
    summary = collect_folder(config, sweeps, plan, results, smi_summary, started, t0)
    for line in summary_lines(summary, folder):
        echo(line)
    if any(s.status == "interrupted" for s in results):
        return EXIT_INTERRUPTED, summary
    bad = any(s["status"] != "ok" for s in summary["steps"]) or summary["failing"]
    return (EXIT_FAILURES if bad else EXIT_OK), summary
