"""Which cases the check runs, and under which options: its two sweep files (speed, accuracy),
read as one run directory's sweep so that ``attnbench show/report/compare`` read the folder.

The GPU check reads ``sweeps/gpu_check_speed.yaml`` and ``sweeps/gpu_check_accuracy.yaml``; the
CPU variant (``--cpu``) their interpreter-sized twins ``gpu_check_cpu_*.yaml``. Each file keeps
its own options (speed: accuracy off; accuracy: timing off); the run directory's manifest holds
the speed file's as ``options`` and both under ``gpu_check.roles``. The kernel-config mode
(``pinned`` by default: one tile config per kernel, no autotuning) is applied here, to the
options (``RunOptions.kernel_configs``) and to the rank pools' environment
(:data:`ENV_KERNEL_CONFIGS`) in every case.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from attnbench.backends import check_backend_name
from attnbench.errors import UserError
from attnbench.resources import ENV_KERNEL_CONFIGS
from attnbench.sweep.case import Case
from attnbench.sweep.flops import case_flops
from attnbench.sweep.load import Sweep, load_sweep
from attnbench.sweep.options import RunOptions

ROLES = ("speed", "accuracy")
KERNEL_CONFIGS = ("pinned", "autotune")
"""``pinned``: one tile config per kernel (compiles once, nothing timed to choose);
``autotune``: today's tuning spaces (minutes of compiling on a fresh box)."""
NAME = "gpu_check"
"""The run directory's sweep name (records of both files in one journal)."""
TIMER_BACKENDS = ("triton", "sdpa_flash")
"""Whose shortest dense call the timer check replays, beside the shortest decode call: launch
gaps matter most where calls are shortest."""


@dataclass(frozen=True)
class CheckSweeps:
    """The check's cases: per role, the sweep file read; and the mode they run under."""

    speed: Sweep
    accuracy: Sweep
    kernel_configs: str = "pinned"

    def role(self, name: str) -> Sweep:
        return {"speed": self.speed, "accuracy": self.accuracy}[name]

    def options(self, role: str) -> RunOptions:
        """The role's options with the kernel-config mode applied where RunOptions has it."""
        return with_kernel_configs(self.role(role).options, self.kernel_configs)

    def combined(self) -> Sweep:
        """One sweep of both files' cases: the run directory's (its manifest, its digest)."""
        return Sweep(name=NAME, path=f"{self.speed.path} + {self.accuracy.path}",
                     cases=self.speed.cases + self.accuracy.cases,
                     options=self.options("speed"),
                     source=f"{self.speed.source}\n---\n{self.accuracy.source}",
                     description=f"attnbench gpu-check: {self.speed.name} + {self.accuracy.name}")

    def roles_manifest(self) -> dict:
        """What the manifest's ``gpu_check.roles`` says: each file, its options, its cases."""
        return {role: {"sweep": self.role(role).path, "options": self.options(role).to_dict(),
                       "cases": [c.id for c in self.role(role).cases]} for role in ROLES}

    def pool_env(self) -> dict[str, str]:
        """The rank pools' environment: the kernel-config mode for the triton backend."""
        return {ENV_KERNEL_CONFIGS: self.kernel_configs}

    def timer_cases(self) -> list[Case]:
        """The speed cases the timer check replays eagerly and from a CUDA graph: the shortest
        dense forward of each of :data:`TIMER_BACKENDS` and the shortest decode call."""
        chosen = []
        for wanted in [*(lambda c, b=b: c.backend == b and not (c.decode or c.is_packed)
                         for b in TIMER_BACKENDS),
                       lambda c: c.backend == "triton" and c.decode]:
            found = [c for c in self.speed.cases if wanted(c)]
            if found:
                chosen.append(min(found, key=lambda c: case_flops(c)[0] + c.seqlen_kv))
        return chosen


def with_kernel_configs(options: RunOptions, mode: str) -> RunOptions:
    """``options`` with ``kernel_configs=mode`` (the check's ``--configs``, pinned by default)."""
    return dataclasses.replace(options, kernel_configs=mode)


def sweep_files(cpu: bool) -> dict[str, str]:
    """role -> file name under the sweeps folder."""
    prefix = "gpu_check_cpu_" if cpu else "gpu_check_"
    return {role: f"{prefix}{role}.yaml" for role in ROLES}


def find_sweeps_dir(given: Optional[str] = None) -> Path:
    """The folder holding the check's sweep files: ``given``, else the checkout's ``sweeps/``
    beside this package, else ``./sweeps``. A missing one is one line (exit 2)."""
    candidates = ([Path(given)] if given else
                  [Path(__file__).resolve().parents[2] / "sweeps", Path("sweeps")])
    for folder in candidates:
        if (folder / sweep_files(False)["speed"]).is_file():
            return folder
    raise UserError(f"{candidates[0]}: no {sweep_files(False)['speed']} there; run the check "
                    "from an attnbench checkout, or name its sweeps folder with --sweeps DIR")


def load_check_sweeps(cpu: bool, kernel_configs: str = "pinned",
                      folder: Optional[str] = None) -> CheckSweeps:
    if kernel_configs not in KERNEL_CONFIGS:
        raise UserError(f"--configs: got {kernel_configs!r}, expected one of "
                        f"{', '.join(KERNEL_CONFIGS)}")
    where = find_sweeps_dir(folder)
    loaded = {role: load_sweep(where / name, check_backend_name)
              for role, name in sweep_files(cpu).items()}
    return CheckSweeps(speed=loaded["speed"], accuracy=loaded["accuracy"],
                       kernel_configs=kernel_configs)
