"""Margins of the dropout-independence mutants and their controls (issue 39 item 2).

For each mutant, on the case tests/mutants/test_mutants.py exposes it with (BASE: Sq = Sk = 128,
4 query heads on 2 KV heads, head dim 32, p = 0.1), in fp32 / fp16 / bf16 and seeds 0-2, the
smallest value / bound of the checks that catch it (``dropout_independence``,
``ranks_mask_replay``); for the correct controls on the same cases -- the seeded hidden mask
(mutant.hidden_seed_dropout), the torch-RNG hidden mask on one device, naive (its mask exposed)
and sdpa -- the largest value / bound of ``dropout_independence`` (a check passes at <= 1):

    python benchmarks/dropout_independence_margins.py [--dtypes bf16] [--seeds 3]
"""

from __future__ import annotations

import argparse

import torch

from attnbench.cluster.task import outcome_to_record
from attnbench.execution.case_runner import run_case
from attnbench.execution.pool import RankPool
from attnbench.sweep.case import make_case
from attnbench.sweep.options import RunOptions, TimingOptions

OPTIONS = RunOptions(timeout_s=300, timing=TimingOptions(enabled=False))
CASE_FUNC = "attnbench.execution.case_runner:run_payload"
BASE = dict(seqlen_q=128, heads_q=4, heads_kv=2, head_dim=32, dropout=0.1)
MUTANTS = {
    "mutant.dropout_heads_share_mask": dict(),
    "mutant.dropout_batch_share_mask": dict(batch=2),
    "mutant.cp_dropout_local_offsets": dict(cp=2),
}
CATCHERS = ("dropout_independence", "ranks_mask_replay")
CONTROLS = {
    "mutant.hidden_seed_dropout": [dict(), dict(batch=2), dict(cp=2), dict(cp=2, cp_algo="zigzag",
                                                                         mask="causal"),
                                   dict(tp=2), dict(seqlens_q=[50, 1, 77], mask="causal")],
    "mutant.hidden_rng_dropout": [dict(), dict(batch=2)],
    "naive": [dict(), dict(batch=2), dict(cp=2), dict(seqlens_q=[50, 1, 77], mask="causal")],
    "sdpa": [dict(), dict(batch=2)],
}


def margins(record: dict, names) -> list[float]:
    return [c["value"] / c["bound"] for c in record["checks"]
            if c["check"] in names and c["bound"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default="fp32,fp16,bf16")
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    pool = RankPool(2, threads=1, preload=[CASE_FUNC.split(":")[0]])

    def run(backend: str, dtype: str, seed: int, fields: dict) -> dict:
        case = make_case("margins", {**BASE, "backend": backend, "dtype": dtype, "seed": seed,
                                     **fields})
        if case.world_size == 1:
            return run_case(case, OPTIONS)
        outcome = pool.run(CASE_FUNC, {"case": case.to_dict(), "options": OPTIONS.to_dict()},
                           timeout=OPTIONS.timeout_s)
        return outcome_to_record(case, outcome, 0.0, 1, OPTIONS.timeout_s)

    try:
        grid = [(d, s) for d in args.dtypes.split(",") for s in range(args.seeds)]
        for name, fields in MUTANTS.items():
            found = []
            for dtype, seed in grid:
                record = run(name, dtype, seed, fields)
                assert record["verdict"] == "fail", (name, record["verdict"], record["reason"])
                found.append(max(margins(record, CATCHERS)))
            print(f"{name:36s} {fields!s:22s} caught, smallest margin {min(found):6.2f}x")
        for name, cases in CONTROLS.items():
            for fields in cases:
                found = []
                for dtype, seed in grid:
                    record = run(name, dtype, seed, fields)
                    assert record["verdict"] == "pass", (name, fields, record["reason"])
                    found += margins(record, ("dropout_independence",))
                worst = f"{max(found):.2f}" if found else "n/a"
                print(f"{name:36s} {fields!s:50s} pass, largest independence value/bound {worst}")
    finally:
        pool.close()


if __name__ == "__main__":
    main()
