"""Per-case harness overhead of a trivial case after warm-up, through the whole path:
client -> Dask scheduler -> worker task -> warm rank pool -> case runner -> record -> journal.

    python benchmarks/case_overhead.py [--cases 200] [--workers 2]

Runs a sweep of `testing.noop` cases (accuracy and timing off) on the embedded cluster and
prints: wall time per case over the whole run (after the first case, which pays for the rank's
start), the time inside the rank process, and the difference (harness overhead).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attnbench.results.store import load_records

SWEEP = """
name: overhead
defaults: {{backend: testing.noop, seqlen_q: 16, heads_q: 1, head_dim: 16, dtype: fp32}}
axes:
  seed: {seeds}
options:
  accuracy: false
  timing: {{enabled: false}}
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sweep = Path(tmp) / "overhead.yaml"
        sweep.write_text(SWEEP.format(seeds=list(range(args.cases))))
        out = Path(tmp) / "run"
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "attnbench.cli", "run", str(sweep), "--out",
                               str(out), "--no-report", "--workers", str(args.workers)],
                              check=False, capture_output=True, text=True)
        total = time.perf_counter() - t0
        records = sorted(load_records(out), key=lambda r: r["started"])
    warm = records[args.workers:]  # the first case of each slot starts its rank
    wall = [r["wall_s"] * 1e3 for r in warm]
    inside = [r["duration_s"] * 1e3 for r in warm]
    overhead = [w - i for w, i in zip(wall, inside)]
    print(f"{len(records)} trivial cases, {args.workers} slots, whole command {total:.1f} s "
          "(cluster start and rank start included)")
    loop = [line for line in proc.stdout.splitlines() if " cases in " in line]
    if loop:  # "attnbench: N cases in X s ...": submission to last record, as the client saw it
        seconds = float(loop[0].split(" cases in ")[1].split()[0])
        print(f"client loop: {seconds:.2f} s for {len(records)} cases = "
              f"{1e3 * seconds / len(records):.2f} ms per case (both slots busy)")
    print(f"per case, warm: task wall median {statistics.median(wall):.2f} ms, inside the rank "
          f"{statistics.median(inside):.2f} ms, harness overhead median "
          f"{statistics.median(overhead):.2f} ms (p90 {statistics.quantiles(overhead, n=10)[-1]:.2f} ms)")


if __name__ == "__main__":
    main()
