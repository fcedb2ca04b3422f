"""The result folder of ``attnbench gpu-check``: its files, each written by one step.

It is a run directory (``manifest.json`` + ``records.jsonl``), so ``attnbench show``, ``report``,
``compare`` and ``export`` read it on any machine, torch or not; the other files are the
check's own. At most :data:`MAX_FILES` files, a few MB: it travels back from a GPU box.
"""

from __future__ import annotations

from pathlib import Path

from attnbench.gpu_check.sweeps import CheckSweeps
from attnbench.results.store import RunStore

MANIFEST = "manifest.json"
RECORDS = "records.jsonl"
PLAN = "plan.json"
PROBE = "probe.json"
CONFIGS = "configs.json"
TIMER = "timer.json"
SMI = "smi.csv"
SUMMARY = "summary.json"

FILES = {
    MANIFEST: "the run's manifest: both sweep files and their options, versions, devices",
    RECORDS: "one record per case (speed: timed; accuracy: judged against fp64)",
    PLAN: "the plan: each step's estimate and timeout on the cost model's machine, variants",
    PROBE: "device identity (NVML), software, measured matmul peak, SDPA's pick per case, "
           "TF32 / reduced-precision flags",
    CONFIGS: "the pre-warm: each Triton variant's kernels, compile seconds and tile configs",
    TIMER: "eager vs CUDA-graph replay of the shortest calls: the host's gaps in the window",
    SMI: "nvidia-smi every 500 ms: SM clock, power, temperature, throttle reasons (GPU only)",
    SUMMARY: "steps (status, seconds vs estimate), verdicts, figures, compile, timer, clocks",
}
MAX_FILES = 8
LOCK_WAIT_S = 30.0
"""The journal's lock: a step killed a moment ago may still hold it (taken over once dead)."""


def folder_files(folder: Path) -> dict[str, int]:
    """Name -> bytes of what the folder holds (hidden files too: a lock left behind counts)."""
    return {p.name: p.stat().st_size for p in sorted(Path(folder).iterdir()) if p.is_file()}


def open_store(folder: Path, sweeps: CheckSweeps) -> RunStore:
    """The result folder as a run directory (made by the driver before the first step, opened
    again by each step that writes records), its manifest naming both sweep files."""
    store = RunStore(folder, sweeps.combined(), command=["attnbench", "gpu-check"],
                     lock_wait_s=LOCK_WAIT_S)
    roles = sweeps.roles_manifest()
    if (store.manifest.get("gpu_check") or {}).get("roles") != roles:
        store.set_manifest(gpu_check={**(store.manifest.get("gpu_check") or {}),
                                      "roles": roles})
    return store
