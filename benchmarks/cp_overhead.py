"""What a CP/TP case costs to dispatch, and how far split results are from unsplit ones.

    python benchmarks/cp_overhead.py [--calls 30] [--run results/<cp_tp run>]

1. Dispatch: a tiny 4-rank case (cp=4 ring, naive fp32, S=64, 4 heads; accuracy and timing off,
   so the ranks do little more than inputs, four ring steps and a gather) on a pool that is
   already warm -- process group created, modules imported. Printed: the whole call as the
   Dask task sees it, the part spent inside rank 0, and the same tiny case at world size 1.
   The design goal is under 100 ms.
2. Parity: every ``check == "parity"`` of the records of a ``sweeps/cp_tp.yaml`` run (``--run``),
   grouped by algorithm and dtype: the largest rel_l2 against the same backend at cp = tp = 1,
   and the largest ratio of that value to its bound. Without ``--run`` the sweep's multi-rank
   cases are run here first, in warm pools without Dask (accuracy on, timing off).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from pathlib import Path

from attnbench.cluster.task import outcome_to_record
from attnbench.execution.pool import RankPool
from attnbench.results.store import load_records
from attnbench.sweep.case import Case
from attnbench.sweep.load import load_sweep
from attnbench.sweep.options import RunOptions, TimingOptions

CASE_FUNC = "attnbench.execution.case_runner:run_payload"
SWEEP = Path(__file__).resolve().parent.parent / "sweeps" / "cp_tp.yaml"
TINY = Case(backend="naive", batch=1, seqlen_q=64, seqlen_kv=64, heads_q=4, heads_kv=2,
            head_dim=16, head_dim_v=16, dtype="fp32", cp=4)
BARE = RunOptions(timeout_s=120, accuracy=False, timing=TimingOptions(enabled=False))
CHECKED = RunOptions(timeout_s=120, timing=TimingOptions(enabled=False))


def _pool(world_size: int) -> RankPool:
    return RankPool(world_size, threads=1, preload=["attnbench.execution.case_runner"])


def dispatch(calls: int, case: Case) -> tuple[list[float], list[float]]:
    """(wall, inside rank 0) seconds of ``calls`` warm runs of ``case``."""
    payload = {"case": case.to_dict(), "options": BARE.to_dict()}
    with _pool(case.world_size) as pool:
        for _ in range(3):  # start ranks, create the process group, import everything
            outcome = pool.run(CASE_FUNC, payload, timeout=120)
            assert outcome.kind == "ok" and outcome.result["verdict"] == "pass", outcome
        walls, inside = [], []
        for _ in range(calls):
            outcome = pool.run(CASE_FUNC, payload, timeout=120)
            walls.append(outcome.wall_s)
            inside.append(outcome.duration_s)
        assert pool.starts == 1
    return walls, inside


def run_sweep_cases(path: Path) -> list[dict]:
    sweep = load_sweep(path)
    pools: dict[int, RankPool] = {}
    records = []
    try:
        for case in sweep.cases:
            if case.world_size == 1:
                continue
            pool = pools.setdefault(case.world_size, _pool(case.world_size))
            t0 = time.perf_counter()
            outcome = pool.run(CASE_FUNC, {"case": case.to_dict(), "options": CHECKED.to_dict()},
                               timeout=CHECKED.timeout_s)
            records.append(outcome_to_record(case, outcome, time.perf_counter() - t0, 1,
                                             CHECKED.timeout_s))
    finally:
        for pool in pools.values():
            pool.close()
    return records


def parity_table(records: list[dict]) -> str:
    groups: dict[tuple, list[dict]] = collections.defaultdict(list)
    verdicts: collections.Counter = collections.Counter()
    for rec in records:
        case = rec["case"]
        if case["cp"] * case["tp"] == 1:
            continue
        verdicts[rec["verdict"]] += 1
        algo = case["cp_algo"] if case["cp"] > 1 else "tp only"
        for check in rec.get("checks") or ():
            if check.get("check") == "parity":
                groups[(algo, case["dtype"], check["tensor"])].append(check)
    lines = [f"multi-rank records: {dict(sorted(verdicts.items()))}",
             f"{'algorithm':10s} {'dtype':5s} {'tensor':6s} {'n':>4s} {'median rel_l2':>14s} "
             f"{'max rel_l2':>11s} {'max value/bound':>16s} {'failed':>6s}"]
    for (algo, dtype, tensor), checks in sorted(groups.items()):
        values = [c["value"] for c in checks if c["value"] is not None]
        ratios = [c["value"] / c["bound"] for c in checks if c["value"] is not None and c["bound"]]
        failed = sum(1 for c in checks if c["passed"] is False)
        lines.append(f"{algo:10s} {dtype:5s} {tensor:6s} {len(checks):4d} "
                     f"{statistics.median(values):14.2e} {max(values):11.2e} "
                     f"{max(ratios):16.3f} {failed:6d}")
    return "\n".join(lines)


def _ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    return (f"median {statistics.median(ordered) * 1e3:7.1f} ms  min {ordered[0] * 1e3:7.1f} ms  "
            f"max {ordered[-1] * 1e3:7.1f} ms  (n={len(ordered)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30, help="warm calls to time")
    parser.add_argument("--run", help="run directory of sweeps/cp_tp.yaml (default: run its "
                                      "multi-rank cases here, without Dask)")
    parser.add_argument("--no-parity", action="store_true")
    args = parser.parse_args()

    walls, inside = dispatch(args.calls, TINY)
    print(f"tiny cp=4 case, warm 4-rank pool: whole call {_ms(walls)}")
    print(f"                          inside rank 0       {_ms(inside)}")
    print(f"                          pool round trip     "
          f"{_ms([w - i for w, i in zip(walls, inside)])}")
    walls1, _ = dispatch(args.calls, TINY.replace(cp=1))
    print(f"same case, world size 1:          whole call {_ms(walls1)}")
    if not args.no_parity:
        records = load_records(args.run) if args.run else run_sweep_cases(SWEEP)
        print(f"\nparity against the same backend at cp=tp=1 ({args.run or SWEEP.name}):")
        print(parity_table(records))


if __name__ == "__main__":
    main()
