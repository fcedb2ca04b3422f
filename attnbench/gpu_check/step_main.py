"""The step's own process: read its config, call its function, exit 0 (or 1 with the reason).

Started by :func:`attnbench.gpu_check.step_runner.run_step` as ``NAME FUNC CONFIG``: FUNC is a
"module:function" the driver chose (:data:`STEP_FUNCS`, or a test's stand-in), called with
the config (a :class:`StepConfig`). A step that fails ends its output with one line naming the
failure (after the last three frames, for whoever debugs it); the summary keeps that tail.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from attnbench.errors import exception_summary

STEP_FUNCS = {
    "probe": "attnbench.gpu_check.probe:run_probe",
    "prewarm": "attnbench.gpu_check.prewarm:run_prewarm",
    "timer": "attnbench.gpu_check.timer_check:run_timer",
    "speed": "attnbench.gpu_check.run_cases:run_speed",
    "accuracy": "attnbench.gpu_check.run_cases:run_accuracy",
}
END_MARGIN_S = 5.0
"""A step stops starting work this long before its timeout, so it ends on its own (its files
written) rather than being killed."""


@dataclass(kw_only=True)
class StepConfig:
    """What every step is told (JSON on its command line)."""

    out: str
    """The result folder."""
    cpu: bool = False
    kernel_configs: str = "pinned"
    sweeps_dir: Optional[str] = None
    timeout_s: float = 60.0
    """This step's timeout (the driver kills it then)."""
    cores: int = 1
    """CPU cores this step may keep busy (the pre-warm's parallel compiles)."""
    warm_module: str = "attnbench.kernels.warm"
    """Where ``variants`` and ``compile_variant`` live (tests: a stand-in)."""
    started: float = field(default_factory=time.monotonic)

    @property
    def folder(self) -> Path:
        return Path(self.out)

    def left_s(self) -> float:
        """Seconds this step may still start work in."""
        return self.started + self.timeout_s - END_MARGIN_S - time.monotonic()

    def to_dict(self) -> dict:
        return asdict(self)


def main(argv: list[str]) -> int:
    name, func_ref, text = argv
    config = StepConfig(**{k: v for k, v in json.loads(text).items() if k != "started"})
    module, _, attr = func_ref.partition(":")
    try:
        func = getattr(importlib.import_module(module), attr)
        func(config)
    except Exception as exc:  # noqa: BLE001 - a step's failure is its status, said in a line
        traceback.print_exc(limit=-3, file=sys.stdout)  # the last frames: where it failed
        print(f"{name}: failed: {exception_summary(exc)}")
        return 1
    return 0
