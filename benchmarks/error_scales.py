"""Measure the error scales the accuracy bounds rest on (see attnbench/accuracy/bounds.py).

Runs correct backends in-process over a feature matrix and several seeds, with timing off, and
prints the largest relative L2 error per (backend, dtype, tensor), the largest ratio of a
backend's error to the baseline it is judged against (fused or naive, per tensor), the largest
identity residual per dtype, and the smallest margin (bound / value) per kind of check.

    python benchmarks/error_scales.py [--backends naive,sdpa,sdpa_flash] [--seeds 3] [--quick]
    python benchmarks/error_scales.py --backends sdpa_flash --seqlens 1024,4096 --seeds 1 --long
"""

from __future__ import annotations

import argparse
import collections
import itertools
import math
import time

from attnbench.execution.case_runner import run_case
from attnbench.sweep.case import make_case
from attnbench.sweep.options import RunOptions, TimingOptions


def cases(args):
    """The matrix: feature crosses, plus ill-conditioned inputs on plain cases; --long keeps
    only a few feature sets at every length (long cases cost seconds each on a CPU)."""
    seqlens = [int(s) for s in args.seqlens.split(",")]
    for backend, dtype, seed, s, hkv, mask, bias, drop, cap, inputs in itertools.product(
            args.backends.split(","), args.dtypes.split(","), range(args.seeds), seqlens,
            [4, 2, 1], ["none", "causal", "window"], ["none", "alibi"], [0.0, 0.1],
            [0.0, 30.0], ["normal", "large_logits", "outliers"]):
        if (cap and bias != "none") or (inputs != "normal" and (drop or cap or bias != "none")):
            continue
        if s >= 512 and (hkv == 2 or inputs != "normal"):
            continue
        if args.long and (drop or cap or mask == "window" or hkv == 2):
            continue
        extra = {"window_left": 31, "window_right": 0} if mask == "window" else {}
        yield make_case("m", dict(backend=backend, dtype=dtype, seed=seed, seqlen_q=s,
                                  heads_q=4, heads_kv=hkv, head_dim=64, mask=mask, bias=bias,
                                  dropout=drop, softcap=cap, inputs=inputs, **extra))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backends", default="naive,sdpa,sdpa_math,sdpa_flash,reference")
    parser.add_argument("--dtypes", default="fp32,fp16,bf16")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seqlens", default="64,203,512")
    parser.add_argument("--quick", action="store_true", help="seqlen 64 and 203 only")
    parser.add_argument("--long", action="store_true", help="a few feature sets per length")
    args = parser.parse_args()
    if args.quick:
        args.seqlens = "64,203"
    options = RunOptions(timing=TimingOptions(enabled=False))
    worst = collections.defaultdict(float)
    ratio = collections.defaultdict(lambda: (0.0, ""))
    ident = collections.defaultdict(float)
    margin = collections.defaultdict(lambda: (math.inf, ""))
    failures = []
    n = 0
    t0 = time.time()
    for case in cases(args):
        rec = run_case(case, options)
        n += 1
        if rec["verdict"] not in ("pass", "unsupported"):
            failures.append((rec["label"], rec["verdict"], rec["reason"]))
        if not rec["accuracy"]:
            continue
        for t, row in rec["accuracy"]["tensors"].items():
            if row.get("rel_l2") is None:
                continue
            inputs = case.inputs if case.inputs != "normal" else ""
            key = (case.backend, case.dtype, t, inputs)
            worst[key] = max(worst[key], row["rel_l2"])
            if row.get("ratio") is not None:
                rkey = (case.backend, case.dtype, t, row.get("baseline") or "")
                if row["ratio"] > ratio[rkey][0]:
                    ratio[rkey] = (row["ratio"], rec["label"])
        for name, row in rec["accuracy"]["identities"].items():
            if row["value"] is not None:
                ident[(case.dtype, name)] = max(ident[(case.dtype, name)], row["value"])
        for c in rec["checks"]:
            if c["value"] and c["bound"]:
                m = c["bound"] / c["value"]
                kind = (c["check"], case.dtype)
                if m < margin[kind][0]:
                    margin[kind] = (m, f"{rec['label']}: {c['tensor']} {c['value']:.3g} vs "
                                       f"{c['bound']:.3g}")
    print(f"{n} cases in {time.time() - t0:.0f} s")
    print("largest rel_l2 against fp64:")
    for key in sorted(worst):
        print("  ", " ".join(k for k in key if k), f"{worst[key]:.3g}")
    print("largest error / baseline error (backend dtype tensor baseline):")
    for key in sorted(ratio):
        print("  ", " ".join(key), f"{ratio[key][0]:.3g}", f"({ratio[key][1]})")
    print("largest identity residual:")
    for key in sorted(ident):
        print("  ", *key, f"{ident[key]:.3g}")
    print("smallest margin (bound/value) per check and dtype:")
    for key in sorted(margin):
        print("  ", *key, f"{margin[key][0]:.3g}", margin[key][1])
    print(f"{len(failures)} cases not passing:")
    for f in failures[:40]:
        print("  ", *f)


if __name__ == "__main__":
    main()
