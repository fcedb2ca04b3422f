"""Margins of the ``lse`` check and of the backend contract (attnbench/accuracy/lse_check.py,
attnbench/accuracy/contract.py): each backend's worst lse error over its bound, as a multiple
of the bound, over dtypes x shapes (rows that see no key, large logits, ALiBi + window, a packed
forward-only call, decode), forward-only cases where they cost nothing.

Correct backends print their largest value / bound (must stay under 1); the mutants of
attnbench/mutants/returned.py their smallest (must stay over 1), or the contract breach they
are an error for:

    python benchmarks/lse_errors.py [--dtypes fp32,bf16,fp16] [--backends naive,triton,...]

(triton on a CPU: TRITON_INTERPRET=1, and --seqlen 64 keeps it to minutes.)
"""

from __future__ import annotations

import argparse

from attnbench.execution.single import run_single_case
from attnbench.sweep.case import make_case
from attnbench.sweep.options import RunOptions, TimingOptions

CORRECT = ("naive", "reference", "mutant.base")
LSE_MUTANTS = ("mutant.lse_base2", "mutant.lse_no_scale", "mutant.lse_rows_shifted",
               "mutant.lse_log2")
MUTANTS = (*LSE_MUTANTS, "mutant.out_fp32", "mutant.gqa_dkv_expanded")
OPTIONS = RunOptions(timeout_s=600, timing=TimingOptions(enabled=False))


def shapes(seqlen: int) -> dict[str, dict]:
    return {
        "dense": dict(seqlen_q=seqlen),
        "no-key rows": dict(seqlen_q=203, seqlen_kv=113, mask="causal"),
        "large_logits": dict(seqlen_q=seqlen, inputs="large_logits"),
        "alibi+window": dict(seqlen_q=seqlen, bias="alibi", mask="window", window_left=20,
                             window_right=0),
        "packed fwd": dict(seqlens_q=[50, 1, 77], seqlen_q=128, mask="causal", backward=False),
        "decode": dict(batch=2, seqlen_q=2, seqlen_kv=45, decode=True, mask="causal"),
    }


def margin(record: dict) -> tuple[float | None, str]:
    """(worst lse value / bound, what happened) of one record."""
    if record["verdict"] == "error":
        return None, record["reason"]
    if record["verdict"] == "unsupported":
        return None, "unsupported"
    worst = max((c["value"] / c["bound"] if c["bound"] else float("inf")
                 for c in record["checks"] if c["check"] == "lse"), default=None)
    return worst, record["verdict"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="fp32,bf16,fp16")
    parser.add_argument("--backends", default=",".join(CORRECT + MUTANTS))
    parser.add_argument("--seqlen", type=int, default=128)
    args = parser.parse_args()
    for backend in args.backends.split(","):
        for dtype in args.dtypes.split(","):
            found = []
            for label, fields in shapes(args.seqlen).items():
                case = make_case("lse", {"heads_q": 4, "heads_kv": 2, "head_dim": 32,
                                         "backend": backend, "dtype": dtype, **fields})
                value, what = margin(run_single_case(case, OPTIONS))
                found.append((label, value, what))
            values = [v for _, v, _ in found if v is not None]
            mutant = backend in LSE_MUTANTS
            pick = (min if mutant else max)(values) if values else None
            head = f"{backend:26s} {dtype:5s}"
            if pick is not None:
                where = next(label for label, v, _ in found if v == pick)
                print(f"{head} lse {'min' if mutant else 'max'} {pick:9.3g} x bound ({where})")
            errors = {what for _, v, what in found if v is None and what != "unsupported"}
            for what in sorted(errors):
                print(f"{head} error: {what}")


if __name__ == "__main__":
    main()
