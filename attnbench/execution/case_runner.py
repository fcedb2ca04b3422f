"""The entry point of a case in a rank process: send it to the single- or the multi-rank runner.

Called by the rank pool as ``attnbench.execution.case_runner:run_payload`` (every rank of a pool
gets the same call). Single-device cases run in :mod:`attnbench.execution.single`, CP/TP cases
in :mod:`attnbench.execution.multi`; both judge through :mod:`attnbench.accuracy.evaluate` and time
through :mod:`attnbench.timing.case`, and neither imports the other.
"""

from __future__ import annotations

# First, before anything imports triton: without a GPU our kernels must run in Triton's
# interpreter, chosen when triton is first imported -- and PyTorch imports triton on its own
# (torch.nn.attention.bias does, for SDPA's causal_lower_right). kernels/__init__.py decides.
import attnbench.kernels  # noqa: F401,I001

import os
from typing import Optional

import torch

from attnbench.execution.kernel_settings import compile_section, kernel_settings
from attnbench.hardware.device import device_env, pick_device
from attnbench.resources import ENV_FAMILY, ENV_KIND
from attnbench.results.records import RecordMaker
from attnbench.sweep.case import Case
from attnbench.sweep.options import RunOptions


def run_payload(payload: dict) -> Optional[dict]:
    """Entry point for the rank pool: payload = {"case": dict, "options": dict}."""
    return run_case(Case.from_dict(payload["case"]), RunOptions.from_dict(payload["options"]))


def run_case(case: Case, options: RunOptions, device: Optional[torch.device] = None
             ) -> Optional[dict]:
    """The case's record (None on ranks other than 0 of a multi-rank case), with its
    ``compile`` section when Triton kernels ran (:mod:`attnbench.execution.kernel_settings`)."""
    with kernel_settings(options, case) as watch:
        record = _run_case(case, options, device)
    if record is not None and "compile" not in record:  # the backend's own report comes first
        section = compile_section(case, options, watch)
        if section is not None:
            record["compile"] = section
    return record


def _run_case(case: Case, options: RunOptions, device: Optional[torch.device]
              ) -> Optional[dict]:
    device = device or pick_device()
    if case.gpu != "any":
        env = device_env(device)
        served = served_kinds(env)
        if case.gpu not in served:
            if int(os.environ.get("RANK", "0")) != 0:
                return None  # every rank decides alike; rank 0's record is the pool's answer
            return RecordMaker(case, env)("skipped", f"case asks for gpu {case.gpu!r}, this "
                                                     f"worker serves {', '.join(sorted(served))}")
    if case.world_size > 1:
        from attnbench.execution.multi import run_parallel_case  # every rank of the pool runs it

        return run_parallel_case(case, options)
    from attnbench.execution.single import run_single_case

    return run_single_case(case, options, device)


def served_kinds(env: dict) -> set[str]:
    """The kinds this rank serves: what its worker advertised (inherited: the exact kind, or
    what ``attnbench worker --kind`` says, and the family), else the hardware's own kind and
    family."""
    if os.environ.get(ENV_KIND):
        return {os.environ[ENV_KIND], os.environ.get(ENV_FAMILY, "")} - {""}
    return {env["gpu_kind"], env.get("gpu_family") or ""} - {""}
