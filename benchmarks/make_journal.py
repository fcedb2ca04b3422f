"""A run directory with a journal of N records, to measure the readers at scale (issue 29).

    python benchmarks/make_journal.py OUT [--records 1000000] [--fail-every 100]

Records are real ones (:func:`attnbench.results.records.make_record` on the cases of a small
sweep over 3 GPU kinds x 4 lengths x 4 seeds, shaped like the simulated workers' records:
~1.2 KB a line) repeated with new case ids and seeds (each block of 48 its own 4), so ``status``,
``show``, ``report``, ``export`` and ``compare`` read N distinct cases (``--repeat-cases``: the
48 cases' own seeds again, as journals made before 2026-12-02 had: then the report's panels and
compare's pairs met 48 distinct cases, not N); one in ``--fail-every`` is a ``fail`` with a reason (what
``show`` lists). The manifest says the sweep has N cases. 1M records: ~1.2 GB, ~30 s here.
Parsing a real sweep of 10^6 cases instead costs ~50 s and ~0.5 GB before the first line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from attnbench.results.records import make_record  # noqa: E402
from attnbench.results.store import RunStore  # noqa: E402
from attnbench.sweep.load import parse_sweep  # noqa: E402

SWEEP = """name: journal
defaults: {backend: naive, batch: 1, heads_q: 8, head_dim: 64, dtype: bf16}
axes: {gpu: [SIM-A, SIM-B, SIM-C], seqlen_q: [512, 1024, 2048, 4096], seed: [0, 1, 2, 3]}
"""


def template(case, verdict: str) -> dict:
    side = {"median_ms": 1.0, "q1_ms": 1.0, "q3_ms": 1.1, "n": 5, "tflops": 400.0,
            "noisy": False}
    timing = {"clock": "simulated", "world_size": 1, "flops_fwd": 1.0e9, "flops_bwd": 2.5e9,
              "fwd": dict(side), "bwd": dict(side)}
    env = {"host": "node-1", "pid": 4242, "simulated": True, "device": "sim:3",
           "gpu_kind": case.gpu, "worker": "sim-0", "worker_kind": case.gpu, "lease": ["3"],
           "lease_start": 1.0e9, "lease_end": 1.0e9 + 0.25}
    reason = "simulated" if verdict == "pass" else "dq: rel. error 1.1 over the bound 0.02"
    return make_record(case, verdict=verdict, reason=reason, timing=timing, env=env,
                       duration_s=0.25, wall_s=0.25, attempt=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--fail-every", type=int, default=100)
    parser.add_argument("--repeat-cases", action="store_true",
                        help="the sweep's 48 cases again and again (only the ids differ)")
    args = parser.parse_args()
    t0 = time.perf_counter()
    sweep = parse_sweep(SWEEP, "journal.yaml")
    store = RunStore(args.out, sweep, command=["make_journal"])
    store.set_manifest(sweep={**store.manifest["sweep"], "cases": args.records})
    store.close()
    cases = sweep.cases
    with open(args.out / "records.jsonl", "w", encoding="utf-8") as fh:
        for i in range(args.records):
            verdict = "fail" if args.fail_every and i % args.fail_every == 0 else "pass"
            case = cases[i % len(cases)]
            if not args.repeat_cases:
                # a case of its own, on each of the 3 GPU kinds (the architecture panel's
                # and compare's matches): the sweep's seeds 0-3 become 4k..4k+3 in block k
                case = dataclasses.replace(case, seed=case.seed + 4 * (i // len(cases)))
            record = template(case, verdict)
            record["id"] = f"{i:016x}"  # the length of a real case id
            fh.write(json.dumps(record, separators=(",", ":")) + "\n")
    size = (args.out / "records.jsonl").stat().st_size
    print(f"{args.out}: {args.records} records, {size / 2**20:.0f} MiB, "
          f"{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
