"""How far correct fused backends sit from the fused-precision baseline (the new bounds' scale).

For each case: the fp64 reference, the fused baseline (:mod:`attnbench.accuracy.fused_baseline`) and
the backend on the same inputs and the same dropout mask; the ratio (backend rel. L2 error) /
(baseline rel. L2 error) per tensor. Prints the largest ratio per (dtype, tensor), per backend
and over all of them, with the case that gave it, and the median.

    python benchmarks/fused_error_ratios.py [--backends sdpa,sdpa_flash,triton] [--seeds 3]
        [--quick] [--jsonl ratios.jsonl]

Matrix (``axes`` below): fp32 / fp16 / bf16; MHA, GQA, MQA (4 query heads); none / causal /
window(31, 0) masks; ALiBi; softcap and dropout where the backend supports them (sdpa has no
softcap and hides its dropout mask: skipped); normal inputs with every feature, large_logits
and outliers inputs on plain cases. ``triton`` runs on the CPU under TRITON_INTERPRET=1, which
upcasts every tile to fp32 (kernels/common.py load_tile): there P and dS are never rounded to
the dtype, so its CPU ratios are *below* a GPU run's; lengths are capped at ``--triton-max``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import math
import statistics
import time
from dataclasses import dataclass

import torch

from attnbench.accuracy.bounds import tensor_errors
from attnbench.accuracy.fused_baseline import FusedBaseline
from attnbench.backends import Capabilities, Unsupported, get_backend
from attnbench.problem.attn_spec import AttnSpec
from attnbench.problem.dropout import hash_keep_mask
from attnbench.problem.inputs import make_inputs
from attnbench.problem.reference import reference_backward, reference_forward
from attnbench.sweep.case import make_case

TENSORS = ("out", "dq", "dk", "dv")
BASELINE = FusedBaseline()  # block_q 128, block_k 64: FA2's forward tile


@dataclass(frozen=True)
class Axes:
    """The matrix, as data."""

    seqlens: tuple[int, ...]
    heads_kv: tuple[int, ...] = (4, 2, 1)
    masks: tuple[str, ...] = ("none", "causal", "window")
    features: tuple[str, ...] = ("plain", "alibi", "softcap", "dropout")
    inputs: tuple[str, ...] = ("normal", "large_logits", "outliers")


FEATURE_FIELDS = {"plain": {}, "alibi": {"bias": "alibi"}, "softcap": {"softcap": 30.0},
                  "dropout": {"dropout": 0.1}}


def cases(backend: str, dtype: str, seed: int, axes: Axes):
    for s, hkv, mask, feature, inputs in itertools.product(
            axes.seqlens, axes.heads_kv, axes.masks, axes.features, axes.inputs):
        if inputs != "normal" and feature != "plain":
            continue  # ill-conditioned inputs on plain cases only (as error_scales.py)
        window = {"window_left": 31, "window_right": 0} if mask == "window" else {}
        yield make_case("r", dict(backend=backend, dtype=dtype, seed=seed, seqlen_q=s,
                                  heads_q=4, heads_kv=hkv, head_dim=64, mask=mask, inputs=inputs,
                                  **FEATURE_FIELDS[feature], **window))


def skip_reason(backend, case) -> str | None:
    """Why a case cannot be judged against an exact-mask reference, or None."""
    why = backend.supports(case, torch.device("cpu"))
    if why:
        return why
    if case.dropout and Capabilities.of(backend).keep_mask is None:
        return "dropout mask hidden"
    return None


class ReferenceCache:
    """fp64 reference and fused-baseline errors per (inputs, spec, dropout mask): the sdpa
    backends share one case's reference."""

    def __init__(self):
        self._cache: dict = {}

    def get(self, case, keep_mask):
        key = (case.replace(backend="-"), keep_mask if case.dropout else None)
        if key not in self._cache:
            self._cache.clear()  # cases come in order: keep one entry, memory stays flat
            q, k, v, dout = make_inputs(case)
            spec = AttnSpec.from_case(case)
            mask = keep_mask or hash_keep_mask
            ref_out, ref_lse = reference_forward(q, k, v, spec, keep_mask=mask)
            ref = dict(zip(TENSORS, (ref_out, *reference_backward(
                q, k, v, ref_out, ref_lse, dout, spec, keep_mask=mask))))
            out, lse = BASELINE.forward(q, k, v, spec, mask)
            grads = BASELINE.backward(q, k, v, out, lse, dout, spec, mask)
            base = {t: tensor_errors(x, ref[t])["rel_l2"] for t, x in zip(TENSORS, (out, *grads))}
            self._cache[key] = ((q, k, v, dout, spec), ref, base)
        return self._cache[key]


def backend_errors(backend, case, cache: ReferenceCache) -> tuple[dict, dict]:
    """(backend rel. L2 errors, baseline rel. L2 errors) per tensor on one case."""
    (q, k, v, dout, spec), ref, base = cache.get(case, Capabilities.of(backend).keep_mask)
    fwd = backend.forward(q, k, v, spec)
    grads = backend.backward(fwd.ctx, dout)
    errors = {t: tensor_errors(x, ref[t])["rel_l2"] for t, x in zip(TENSORS, (fwd.out, *grads))}
    return errors, base


class RatioTable:
    """What the matrix measured: ratios per (backend, dtype, tensor), the baseline's own largest
    error per (dtype, tensor, inputs), and what was skipped and why."""

    def __init__(self):
        self.ratios = collections.defaultdict(list)  # key -> [(ratio, case label)]
        self.baseline_worst = collections.defaultdict(float)
        self.skipped = collections.Counter()
        self.cases = 0

    def add(self, case, errors: dict, baseline: dict) -> list[dict]:
        """Record one backend case; return its rows for --jsonl."""
        self.cases += 1
        rows = []
        for t in TENSORS:
            ratio = errors[t] / baseline[t] if baseline[t] > 0 else math.inf
            self.ratios[(case.backend, case.dtype, t)].append((ratio, case.label))
            key = (case.dtype, t, case.inputs)
            self.baseline_worst[key] = max(self.baseline_worst[key], baseline[t])
            rows.append({"case": case.to_dict(), "tensor": t, "backend_rel_l2": errors[t],
                         "baseline_rel_l2": baseline[t], "ratio": ratio})
        return rows

    def print(self, dtypes: list[str], backends: list[str]) -> None:
        print("\nratio = backend rel_l2 / fused-baseline rel_l2 (same inputs, same mask): "
              "max [median] (case of the max)")
        for dtype, t in itertools.product(dtypes, TENSORS):
            worst_of_all = None
            for name in backends:
                values = self.ratios.get((name, dtype, t))
                if not values:
                    continue
                worst = max(values)
                worst_of_all = max(worst_of_all or worst, worst)
                median = statistics.median(r for r, _ in values)
                print(f"  {dtype:4} {t:3} {name:10} {worst[0]:6.3f} [{median:5.3f}] "
                      f"n={len(values):4}  {worst[1]}")
            if worst_of_all:
                print(f"  {dtype:4} {t:3} {'ALL':10} {worst_of_all[0]:6.3f}")
        print("\nlargest fused-baseline rel_l2 against fp64 (dtype tensor inputs):")
        for key in sorted(self.baseline_worst):
            print("  ", *key, f"{self.baseline_worst[key]:.3g}")
        if self.skipped:
            print("\nskipped:")
            for (name, why), count in sorted(self.skipped.items()):
                print(f"   {name}: {count} x {why}")


def run_matrix(args, seqlens, seeds: int, table: RatioTable, sink) -> None:
    """Every case of the matrix on every backend, one fp64 reference per case."""
    cache = ReferenceCache()
    backends = [get_backend(name) for name in args.backends.split(",")]
    interpreted = not torch.cuda.is_available()
    for dtype, seed in itertools.product(args.dtypes.split(","), range(seeds)):
        for generic in cases("-", dtype, seed, Axes(seqlens=seqlens)):
            for backend in backends:
                case = generic.replace(backend=backend.name)
                why = skip_reason(backend, case)
                if not why and backend.name == "triton" and interpreted \
                        and case.seqlen_q > args.triton_max:
                    why = f"longer than --triton-max {args.triton_max} (interpreter)"
                if why:
                    table.skipped[(backend.name, why)] += 1
                    continue
                try:
                    errors, baseline = backend_errors(backend, case, cache)
                except Unsupported as exc:
                    table.skipped[(backend.name, str(exc).split("(")[0])] += 1
                    continue
                for row in table.add(case, errors, baseline):
                    if sink:
                        sink.write(json.dumps(row) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="sdpa,sdpa_flash,triton")
    parser.add_argument("--dtypes", default="fp32,fp16,bf16")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seqlens", default="64,203,512")
    parser.add_argument("--triton-max", type=int, default=203,
                        help="longest sequence for triton under the CPU interpreter")
    parser.add_argument("--quick", action="store_true", help="seqlens 64,203, one seed")
    parser.add_argument("--jsonl", help="also write one line per (case, tensor)")
    args = parser.parse_args()
    seqlens = (64, 203) if args.quick else tuple(int(s) for s in args.seqlens.split(","))
    seeds = 1 if args.quick else args.seeds
    table = RatioTable()
    started = time.time()
    with contextlib.ExitStack() as stack:
        sink = stack.enter_context(open(args.jsonl, "w")) if args.jsonl else None
        run_matrix(args, seqlens, seeds, table, sink)
    print(f"{table.cases} backend cases in {time.time() - started:.0f} s, torch threads "
          f"{torch.get_num_threads()}, seqlens {seqlens}, seeds {seeds}")
    table.print(args.dtypes.split(","), args.backends.split(","))


if __name__ == "__main__":
    main()
