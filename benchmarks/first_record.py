"""Time to the first record (issue 40, item 9): how long ``attnbench run`` takes from the
command to its first line, the sweep loaded, the cluster up, and the first record in the
journal, on the embedded cluster.

    python benchmarks/first_record.py [--sweep sweeps/smoke.yaml] [--repeat 3] [--cases 4]

Each repeat runs ``attnbench run SWEEP --out NEW --no-report`` as a subprocess, limited to the
sweep's first ``--cases`` cases (``--case`` ids), reads its output as it comes and polls the
journal every 20 ms, once with the embedded worker's rank pools started as it starts (the
default) and once without (``ATTNBENCH_PREWARM=0``: they start with the first case), one after
the other; it prints one row per run and the medians of each, in seconds since the command
started:

    first line   the first line on stdout or stderr (a user sees something)
    sweep        "sweep '...': N cases ..." (the sweep loaded and checked, the run directory made)
    cluster      "running on ..." (the cluster up, workers connected)
    record       the journal's first line
    done         the command's exit

The smoke run's first record came 19 s after the command when this was measured first (sweep
loaded 2.8 s, cluster up 7.8 s, under load); a quiet box should see it in a few seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKS = (("sweep", "attnbench: sweep "), ("cluster", "attnbench: running on "))
COLUMNS = ("first line", "sweep", "cluster", "record", "done")
NAMES = {"1": "early", "0": "on demand"}
"""ATTNBENCH_PREWARM: the rank pools started as the worker starts, or by the first case."""


def _case_ids(sweep: str, count: int) -> list[str]:
    from attnbench.backends import check_backend_name
    from attnbench.sweep.load import load_sweep

    return [c.id for c in load_sweep(sweep, check_backend_name).cases[:count]]


def one_run(sweep: str, ids: list[str], out: Path, prewarm: str) -> dict[str, float]:
    argv = [sys.executable, "-m", "attnbench", "run", sweep, "--out", str(out), "--no-report"]
    for case_id in ids:
        argv += ["--case", case_id]
    seen: dict[str, float] = {}
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=dict(os.environ, PYTHONWARNINGS="ignore",
                                                ATTNBENCH_PREWARM=prewarm))

    def read() -> None:
        for line in proc.stdout:
            now = time.perf_counter() - t0
            seen.setdefault("first line", now)
            for name, start in MARKS:
                if line.startswith(start):
                    seen.setdefault(name, now)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    journal = out / "records.jsonl"
    while proc.poll() is None:
        if "record" not in seen and journal.exists() and journal.stat().st_size:
            seen["record"] = time.perf_counter() - t0
        time.sleep(0.02)
    seen["done"] = time.perf_counter() - t0
    reader.join(timeout=5)
    if proc.returncode not in (0, 1, 4):
        raise SystemExit(f"attnbench run exited {proc.returncode}")
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", default="sweeps/smoke.yaml")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cases", type=int, default=4)
    args = parser.parse_args()
    ids = _case_ids(args.sweep, args.cases)
    rows: dict[str, list[dict]] = {"1": [], "0": []}
    print(f"{args.sweep}, {len(ids)} cases, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}")
    print(f"{'pools':>10}  " + "  ".join(f"{c:>10}" for c in COLUMNS))
    for _ in range(args.repeat):
        for prewarm in rows:
            with tempfile.TemporaryDirectory() as tmp:
                row = one_run(args.sweep, ids, Path(tmp) / "run", prewarm)
            rows[prewarm].append(row)
            print(f"{NAMES[prewarm]:>10}  " + "  ".join(
                f"{row.get(c, float('nan')):>10.2f}" for c in COLUMNS), flush=True)
    for prewarm, runs in rows.items():
        print(f"{NAMES[prewarm]:>10}  " + "  ".join(
            f"{statistics.median(r.get(c, float('nan')) for r in runs):>10.2f}"
            for c in COLUMNS) + "   (median)")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
