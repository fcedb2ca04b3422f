"""The record: one JSON object per case in ``results/<run>/records.jsonl``.

Everything downstream (``attnbench show``, reports, compare, pandas) reads these fields::

    {
      "id": "3fa2b1c04d5e6f70",            # Case.id: hash of the case's content
      "case": {...every Case field...},
      "label": "naive bf16 b1 s256/256 h8/2 d64 GQA causal seed0",
      "features": "GQA causal alibi dropout0.1",   # Case.features, for grouping
      "verdict": "pass",                   # one of VERDICTS
      "reason": "",                        # one line; why it is not a pass
      "checks": [                          # every check that was made, passed or not
        {"check": "reference", "tensor": "dq", "metric": "rel_l2",
         "value": 0.0041, "bound": 0.012, "passed": true}, ...],
      "accuracy": {                        # null when accuracy was off or the case never ran
        "reference": "exact" | "exact-mask" | "none: <why>",
        "tensors": {"out": {"rel_l2", "max_abs", "cosine", "nonfinite",
                            "baseline_rel_l2", "ratio", "bound"}, "dq": ..., "dk": ..., "dv": ...},
        "identities": {"dv_v": {"value", "bound"}, "dq_q": {...}, "dk_sum": {...}}
      },
      "timing": {                          # null when timing was off or the case never ran
        "clock": "cuda_events" | "perf_counter",
        "flops_fwd": 1.2e9, "flops_bwd": 3.0e9,
        "fwd": {"median_ms", "q1_ms", "q3_ms", "min_ms", "n", "samples_ms": [...],
                "tflops", "pct_peak"},
        "bwd": {...same...}
      },
      "crash": null | {"signal": "SIGSEGV", "exit_code": -11, "rank": 0,
                       "stderr_tail": "...", "traceback": "..."},
      "env": {"host", "device", "gpu_kind", "device_name", "torch", "triton", "attnbench",
              "python"},
      "started": "2026-11-29T15:02:03Z", "duration_s": 0.41,  # inside the rank process
      "wall_s": 0.45,                      # as seen by the Dask task, pool round trip included
      "attempt": 1
    }
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
from typing import Any

# Verdicts, best to worst for colouring. "pass"/"fail" come from accuracy checks; "error" is a
# Python exception in the backend; "crash"/"timeout"/"oom" are the rank process dying, hanging
# or running out of memory; "lost" is a case no worker could finish after bounded retries.
VERDICTS = ("pass", "fail", "error", "crash", "timeout", "oom", "unsupported", "skipped", "lost")
BAD_VERDICTS = ("fail", "error", "crash", "timeout", "oom", "lost")
TENSORS = ("out", "dq", "dk", "dv")


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def host_env() -> dict[str, Any]:
    """Environment fields that need no torch (the rank process adds device and versions)."""
    from attnbench import __version__

    return {"host": socket.gethostname(), "python": platform.python_version(),
            "attnbench": __version__, "pid": os.getpid()}


def make_record(case, *, verdict: str, reason: str = "", checks=None, accuracy=None, timing=None,
                crash=None, env=None, started: str | None = None, duration_s: float = 0.0,
                wall_s: float | None = None, attempt: int = 1) -> dict[str, Any]:
    assert verdict in VERDICTS, verdict
    return {
        "id": case.id,
        "case": case.to_dict(),
        "label": case.label,
        "features": case.features,
        "verdict": verdict,
        "reason": reason,
        "checks": list(checks or []),
        "accuracy": accuracy,
        "timing": timing,
        "crash": crash,
        "env": env or host_env(),
        "started": started or utc_now(),
        "duration_s": duration_s,
        "wall_s": duration_s if wall_s is None else wall_s,
        "attempt": attempt,
    }
