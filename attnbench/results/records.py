"""The record: one JSON object per case in ``results/<run>/records.jsonl``.

Everything downstream (``attnbench show``, reports, compare, pandas) reads these fields::

    {
      "id": "3fa2b1c04d5e6f70",            # Case.id: hash of the case's content
      "case": {...every Case field...},
      "label": "naive bf16 b1 s256/256 h8/2 d64 GQA causal seed0",
      "features": "GQA causal alibi dropout0.1",   # Case.features, for grouping
      "verdict": "pass",                   # one of VERDICTS ("timed": accuracy off)
      "reason": "",                        # one line; why it is not a pass
      "checks": [                          # every check that was made, passed or not
        {"check": "reference", "tensor": "dq", "metric": "rel_l2",
         "value": 0.0041, "bound": 0.012, "passed": true}, ...],
      "accuracy": {                        # null when accuracy was off or the case never ran
        "reference": "exact" | "exact-mask" | "none: <why>",
        "tensors": {"out": {"rel_l2", "max_abs", "cosine", "nonfinite",
                            "baseline_rel_l2", "ratio", "bound", "baseline",  # judged by
                            "fused_rel_l2", "fused_ratio"},  # vs a fused kernel, always
                    "dq": ..., "dk": ..., "dv": ...},
        "identities": {"dv_v": {"value", "bound"}, "dq_q": {...}, "dk_sum": {...}},
        "backward": "not applicable: ..."  # forward-only cases (case.backward false: decode):
      },                                   # tensors holds "out" only, identities are {}
      "timing": {                          # null when timing was off or the case never ran
        "clock": "cuda_events" | "perf_counter" | "process_time",   # (CPU time: cpu_clock: cpu)
        "mode": "eager" | "graph", "world_size": 1,
        "l2_flush_bytes": 268435456,       # flushed before every timed call (0 on CPU)
        "flops_fwd": 1.2e9, "flops_bwd": 3.0e9,   # attnbench.sweep.flops: exact pairs, exact bwd
        "bytes_fwd": 2.1e6, "bytes_bwd": 4.2e6,   # minimal traffic (each tensor once)
        "peak_tflops": 989.4,              # datasheet, one device, the case's dtype
        "measured_peak_tflops": 781.0,     # this worker's own matmul peak
        "peak_bandwidth_gbs": 4800.0,      # datasheet memory bandwidth (null: unknown, CPU)
        "note": "...",                     # present when FLOP/s are not meaningful
        "fwd": {"median_ms", "q1_ms", "q3_ms", "min_ms", "n", "samples_ms": [...],
                "calls_per_sample", "warmup_calls", "warmup_ms",
                "noisy",                   # the spread never settled: compare says AMBIGUOUS
                "tflops", "pct_peak", "pct_measured_peak", "gbps",
                "pct_peak_bandwidth",      # gbps over the datasheet bandwidth (decode's figure)
                "peak_memory_bytes",
                "timed_as"},               # "graph" | "eager": mode graph fell back here
        "bwd": {...same...} | null,        # null for a forward-only case (flops/bytes_bwd too)
        "clocks_fwd": {"sm_mhz": [start, end], "sm_mhz_max", "reasons": "sw_power_cap,...",
                       "power_violation_ms", "thermal_violation_ms", "energy_j",
                       "throttled"},       # NVML around the window (GPU only): hardware.clock_watch
        "clocks_bwd": {...same...}
      },
      "compile": {                         # absent when no Triton kernel of ours ran (older
        "mode": "autotune" | "pinned",     # records too); attnbench.execution.kernel_settings
        "interpreted": false,              # TRITON_INTERPRET=1: nothing compiles (0 s, 0 kernels)
        "seconds": 2.41, "kernels": 4,     # Triton compiles during this case, apart from timing
        "autotune_s": 0.0,                 # the autotuner's benchmarking during this case
        "configs": {"_attn_fwd": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8,
                                  "num_stages": 3}, ...},   # the tile each kernel launched with
        "variant": "bf16 d128 gqa window fwd+bwd pinned",  # attnbench.kernels.warm.label
        "fp8_max_imprecise_acc": 0},       # fp8 cases: the promotion option (0: Triton's)
      "crash": null | {"signal": "SIGSEGV", "exit_code": -11, "rank": 0,
                       "stderr_tail": "...", "traceback": "..."},
      "env": {"host", "device", "device_name", "gpu_kind" (exact: "H100-SXM5-80GB"),
              "gpu_family" ("H100"), "torch", "triton", "attnbench", "python",
              "identity": {...attnbench.hardware.DeviceIdentity: PCI id, memory, SM count,
                           clocks, power limit, ECC, driver...},
              "software": {torch, triton, cuda_runtime, cudnn, nccl, driver_version, commit,
                           dirty, ...},
              "backend": {module, distribution, version, source_sha256}},
      "started": "2026-11-29T15:02:03Z", "duration_s": 0.41,  # inside the rank process
      "wall_s": 0.45,                      # as seen by the Dask task, pool round trip included
      "attempt": 1
    }
"""

from __future__ import annotations

import datetime as _dt
import time
import traceback
from typing import Any

from attnbench.errors import exception_summary
from attnbench.hardware.identity import host_env

# -- verdicts: every subset and both orders, declared here only ---------------------------------
# Verdicts, best to worst for colouring. "pass"/"fail" come from accuracy checks; "timed" is a
# case run with `accuracy: false` -- timed and checked for NaN/Inf only, so never green; "error"
# is a Python exception in the backend; "crash"/"timeout"/"oom" are the rank process dying,
# hanging or running out of memory; "lost" is a case no worker could finish after bounded retries.
VERDICTS = ("pass", "timed", "fail", "error", "crash", "timeout", "oom", "unsupported", "skipped",
            "lost")
# Worst first, for "coloured by worst" cells and the dashboard's sort orders. A silent wrong
# answer (fail) ranks above a loud crash: a crash stops a training run, a wrong gradient quietly
# ruins it (seeds/001). "timed" (not judged) ranks above pass, so a group with one unjudged case
# is never green.
SEVERITY = ("fail", "crash", "error", "lost", "timeout", "oom", "timed", "unsupported", "skipped",
            "pass")
assert set(SEVERITY) == set(VERDICTS)
BAD_VERDICTS = ("fail", "error", "crash", "timeout", "oom", "lost")
"""Failures: a run with one exits EXIT_FAILURES; printed as they come, listed by show and pages."""
JUDGED_VERDICTS = ("pass", "fail")
"""Verdicts whose accuracy was checked against a reference or the identities."""
RAN_VERDICTS = ("pass", "timed", "fail")
"""Cases that ran to the end: the ones whose records may carry numbers (plots, compare)."""
NOT_JUDGED_VERDICTS = tuple(v for v in RAN_VERDICTS if v not in JUDGED_VERDICTS)  # ("timed",)
"""Ran to the end without an accuracy verdict (``accuracy: false``)."""
DIED_VERDICTS = tuple(v for v in BAD_VERDICTS if v not in RAN_VERDICTS)
"""error, crash, timeout, oom, lost: the case did not run to the end, so it has no result."""
NOT_RUN_VERDICTS = tuple(v for v in VERDICTS if v not in RAN_VERDICTS + DIED_VERDICTS)
"""unsupported, skipped: the case never started (its backend refused it; no connected worker
could run it). A run whose every case is one of these ran nothing (:mod:`~.outcome`)."""
TENSORS = ("out", "dq", "dk", "dv")
IDENTITIES = ("dv_v", "dq_q", "dk_sum")
"""The reference-free identities a record's ``accuracy.identities`` names (DESIGN.md)."""
CHECKS = ("reference", "baseline_ratio", "identity", "nonfinite", "determinism", "parity",
          "dropout", "dropout_independence", "ranks_mask_replay", "lse")
"""What a ``checks`` entry may be: an error against the fp64 reference held to an absolute
bound, or to a ratio of the baseline's; a gradient identity's residual; NaN/Inf counted; two
runs' elements differing; a multi-rank result against one device's; a dropout mask or its
statistics; two masks that should be independent agreeing too often; a CP/TP run whose masks
are not the single-device mask its seed replays; a returned log-sum-exp against the
reference's. Checked where a check is made (:class:`attnbench.accuracy.bounds.Check`) and where
one is read by name (tests/project/test_vocabularies.py)."""


TRACEBACK_CHARS = 4000
"""The end of a traceback a record keeps (its ``crash.traceback``)."""


def handled_crash() -> dict:
    """The ``crash`` field of a record made while an exception is handled: its traceback's last
    :data:`TRACEBACK_CHARS` characters. (A rank that died: ``Outcome.crash_info`` in
    :mod:`attnbench.execution.ranks`, the other fields.)"""
    return {"traceback": traceback.format_exc()[-TRACEBACK_CHARS:]}


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


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


class RecordMaker:
    """The records of one case run inside a rank: one env, one start time, duration since."""

    def __init__(self, case, env: dict[str, Any]):
        self.case, self.env = case, env
        self.started, self._t0 = utc_now(), time.perf_counter()

    def __call__(self, verdict: str, reason: str = "", **fields: Any) -> dict[str, Any]:
        return make_record(self.case, verdict=verdict, reason=reason, env=self.env,
                           started=self.started, duration_s=time.perf_counter() - self._t0,
                           **fields)

    def exception(self, verdict: str, exc: BaseException, prefix: str = "",
                  **fields: Any) -> dict[str, Any]:
        """A record for an exception being handled: its summary as the reason, the traceback
        kept."""
        return self(verdict, prefix + exception_summary(exc),
                    crash=handled_crash(), **fields)
