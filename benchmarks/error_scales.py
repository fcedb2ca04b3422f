"""Measure the error scales the accuracy bounds rest on (see attnbench/accuracy.py).

Runs correct backends in-process over a feature matrix and several seeds, with timing off,
and prints the largest relative L2 error per (backend, dtype, tensor), the largest identity
residual per dtype, and the smallest margin (bound / value) of any check.

    python benchmarks/error_scales.py [--backends naive,sdpa,sdpa_math] [--seeds 5] [--quick]
"""

from __future__ import annotations

import argparse
import collections
import itertools
import math
import time

from attnbench.execution.case_runner import run_case
from attnbench.spec import RunOptions, TimingOptions, make_case


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backends", default="naive,sdpa,sdpa_math,sdpa_flash,reference")
    parser.add_argument("--dtypes", default="fp32,fp16,bf16")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer shapes")
    args = parser.parse_args()
    options = RunOptions(timing=TimingOptions(enabled=False))
    seqlens = [64, 203] if args.quick else [64, 203, 512]
    worst = collections.defaultdict(float)
    ident = collections.defaultdict(float)
    margin = (math.inf, "")
    failures = []
    n = 0
    t0 = time.time()
    for backend, dtype, seed, s, hkv, mask, bias, drop, cap, inputs in itertools.product(
            args.backends.split(","), args.dtypes.split(","), range(args.seeds), seqlens,
            [4, 2, 1], ["none", "causal", "window"], ["none", "alibi"], [0.0, 0.1],
            [0.0, 30.0], ["normal", "large_logits", "outliers"]):
        if (cap and bias != "none") or (inputs != "normal" and (drop or cap or bias != "none")):
            continue  # keep the matrix affordable: feature crosses, plus inputs on plain cases
        if s == 512 and (hkv == 2 or inputs != "normal"):
            continue
        extra = {"window_left": 31, "window_right": 0} if mask == "window" else {}
        case = make_case("m", dict(backend=backend, dtype=dtype, seed=seed, seqlen_q=s,
                                   heads_q=4, heads_kv=hkv, head_dim=64, mask=mask, bias=bias,
                                   dropout=drop, softcap=cap, inputs=inputs, **extra))
        rec = run_case(case, options)
        n += 1
        if rec["verdict"] not in ("pass", "unsupported"):
            failures.append((rec["label"], rec["verdict"], rec["reason"]))
        if not rec["accuracy"]:
            continue
        for t, row in rec["accuracy"]["tensors"].items():
            if row.get("rel_l2") is not None:
                key = (backend, dtype, t, inputs if inputs != "normal" else "")
                worst[key] = max(worst[key], row["rel_l2"])
        for name, row in rec["accuracy"]["identities"].items():
            if row["value"] is not None:
                ident[(dtype, name)] = max(ident[(dtype, name)], row["value"])
        for c in rec["checks"]:
            if c["value"] and c["bound"]:
                m = c["bound"] / c["value"]
                if m < margin[0]:
                    margin = (m, f"{rec['label']}: {c['check']} {c['tensor']} "
                                 f"{c['value']:.3g} vs {c['bound']:.3g}")
    print(f"{n} cases in {time.time() - t0:.0f} s")
    print("largest rel_l2 against fp64:")
    for key in sorted(worst):
        print("  ", " ".join(k for k in key if k), f"{worst[key]:.3g}")
    print("largest identity residual:")
    for key in sorted(ident):
        print("  ", *key, f"{ident[key]:.3g}")
    print(f"smallest margin (bound/value): {margin[0]:.3g}  {margin[1]}")
    print(f"{len(failures)} cases not passing:")
    for f in failures[:40]:
        print("  ", *f)


if __name__ == "__main__":
    main()
