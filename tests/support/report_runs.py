"""Runs and reports shared by the report tests, made once per pytest session.

``tiny_run`` runs ``tests/support/data/tiny.yaml`` through the real CLI (``attnbench run ...
--no-report``),
so figures are drawn from real records; the synthetic runs (``attnbench.report.synthetic``) add
what a CPU cannot make: GPU kinds, percent of peak, parity checks, the three seed bugs.
Each is written under pytest's session temp dir and reused by every test module (a ``.done``
marker says it is complete).

Loaded by the test modules with :func:`load` (tests/ is not a package).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "support" / "data"
TINY_SWEEP = "tests/support/data/tiny.yaml"  # relative: the manifest keeps it for repro commands
TINY_TIMEOUT_S = 600


def _done(path: Path) -> bool:
    return (path / ".done").exists()


def tiny_run(base: Path) -> Path:
    """A real run of the tiny sweep (about 10 s on 2 CPU cores)."""
    out = base / "tiny-run"
    if _done(out):
        return out
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "attnbench.cli", "run", TINY_SWEEP, "--out",
                           str(out), "--no-report"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=TINY_TIMEOUT_S)
    # exit 1 is expected: the sweep has a deliberate crash (testing.segfault)
    if proc.returncode not in (0, 1) or not (out / "records.jsonl").exists():
        raise RuntimeError(f"attnbench run {TINY_SWEEP} failed with exit {proc.returncode}:\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    (out / ".done").touch()
    return out


UPGRADED = {"driver_version": "560.35.03", "cuda_runtime": "12.6", "cuda_driver_version": "12.6"}


def synthetic_runs(base: Path) -> dict[str, Path]:
    """Records as written before exact identity (coarse kinds, no noisy/GB/s/memory): h100 (the
    baseline), h100-slower (triton 20% slower, one more failure, another torch), a100 (the same
    sweep on another GPU kind) and mixed (H100 and A100 in one run).

    Records with every field of today (exact kinds, identity, software, noisy, GB/s, memory):
    sxm (H100 SXM5), sxm-upgraded (the same card after a driver, CUDA and torch upgrade; triton
    20% slower but its timings never settled), pcie (the same sweep on an H100 PCIe) and
    sxm-timed (a speed-only run, `accuracy: false`, whose sdpa_flash timings are noisy)."""
    from attnbench.report.synthetic import write_synthetic_run

    specs = {
        "h100": dict(gpus=["H100"], seed=0),
        "h100-slower": dict(gpus=["H100"], seed=1, slowdown=1.2, extra_broken=True,
                            torch_version="2.6.0+cu126"),
        "a100": dict(gpus=["A100"], seed=2),
        "mixed": dict(gpus=["H100", "A100"], seed=3),
        "sxm": dict(gpus=["H100-SXM5-80GB"], seed=0),
        "sxm-upgraded": dict(gpus=["H100-SXM5-80GB"], seed=1, slowdown=1.2, noisy_backend="triton",
                             torch_version="2.6.0+cu126", software=UPGRADED),
        "pcie": dict(gpus=["H100-PCIe-80GB"], seed=2),
        "sxm-timed": dict(gpus=["H100-SXM5-80GB"], seed=3, accuracy=False,
                          noisy_backend="sdpa_flash"),
    }
    runs = {}
    for name, kw in specs.items():
        out = base / "synthetic" / name
        if not _done(out):
            write_synthetic_run(out, size="small", **kw)
            (out / ".done").touch()
        runs[name] = out
    return runs


def report(base: Path, name: str, run_dir: Path) -> Path:
    """``write_report`` of ``run_dir`` with the project's default dashboard, made once."""
    from attnbench.report.commands import write_report

    out = base / "reports" / name
    if not _done(out):
        index = write_report(run_dir, ROOT / "dashboards" / "default.yaml", out)
        assert index == out / "index.html"
        (out / ".done").touch()
    return out / "index.html"


def edit_run(src: Path, dst: Path, edit: Callable[[dict], None]) -> Path:
    """A copy of run ``src`` at ``dst`` (its run id: ``dst``'s name) whose records went
    through ``edit(record)``."""
    shutil.copytree(src, dst)
    records = [json.loads(line) for line in (dst / "records.jsonl").read_text().splitlines()]
    for rec in records:
        edit(rec)
    (dst / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    manifest = json.loads((dst / "manifest.json").read_text())
    (dst / "manifest.json").write_text(json.dumps({**manifest, "run_id": dst.name}))
    return dst


def artifacts_dir() -> Path:
    """Where tests leave screenshots for people to look at (git-ignored build/)."""
    path = Path(os.environ.get("ATTNBENCH_TEST_ARTIFACTS", ROOT / "build" / "test-artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path
