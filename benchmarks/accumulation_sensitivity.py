"""How tight is the accuracy rule for fused kernels, and how small an accumulation error does the
standard sweep's length ladder catch?

    python benchmarks/accumulation_sensitivity.py            # bf16, the ladder 512 ... 8192
    python benchmarks/accumulation_sensitivity.py --quick    # 512 ... 2048

Part 1 -- old and new bound for a correct fused kernel, per dtype: the old rule was
2 x naive's error + RATIO_FLOOR, the new one 2 x the fused baseline's + FUSED_FLOOR (both from
attnbench.accuracy.bounds), on the same inputs (4 heads, d64, causal, normal inputs).

Part 2 -- an accumulator kept with fewer mantissa bits than fp32 (bf16 keeps 8 significant bits,
fp16 11, fp32 24): the fused baseline with its P·V accumulator (forward) or its dQ accumulator
(backward) rounded to ``bits`` after every key block, on the ladder of sweeps/standard.yaml
(1 head, d64, bf16 inputs). For each width it prints the worst value / bound of the per-case
check and the trend's slope over SLOPE_BOUND: the smallest loss the sweep catches is the widest
accumulator still over 1 in either.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from attnbench.accuracy import bounds as acc
from attnbench.accuracy.evaluate import References
from attnbench.accuracy.fused_baseline import FusedBaseline, fused_backward, fused_forward
from attnbench.problem.attn_spec import AttnSpec
from attnbench.problem.dropout import hash_keep_mask
from attnbench.problem.inputs import make_inputs
from attnbench.report.read.trends import SLOPE_BOUND, Point, Series, fit
from attnbench.results.records import TENSORS
from attnbench.sweep.case import make_case


def round_to_bits(x: torch.Tensor, bits: int) -> torch.Tensor:
    """x rounded to ``bits`` significant bits (round to nearest), in fp32."""
    mantissa, exponent = torch.frexp(x)
    scale = float(2 ** bits)
    return torch.ldexp(torch.round(mantissa * scale) / scale, exponent)


@dataclasses.dataclass(frozen=True)
class NarrowAccumulators(FusedBaseline):
    pv_bits: int = 24
    dq_bits: int = 24

    def accumulate_pv(self, acc_, correction, pv, dtype):
        return round_to_bits(acc_ * correction[..., None] + pv, self.pv_bits)

    def accumulate_dq(self, dq, contribution, dtype):
        return round_to_bits(dq + contribution, self.dq_bits)


def errors(model, case):
    spec = AttnSpec.from_case(case)
    q, k, v, dout = make_inputs(case)
    refs = References(q, k, v, dout, spec)
    out, lse = model.forward(q, k, v, spec)
    dq, dk, dv = model.backward(q, k, v, out, lse, dout, spec)
    mine = refs.errors(dict(zip(TENSORS, (out, dq, dk, dv))), None)
    out_b, lse_b = fused_forward(q, k, v, spec)
    grads = fused_backward(q, k, v, out_b, lse_b, dout, spec)
    base = refs.errors(dict(zip(TENSORS, (out_b, *grads))), None)
    return mine, base


def bounds_table(lengths) -> None:
    from attnbench.backends import get_backend

    print("Part 1: bound for a correct fused kernel, old (2 x naive + floor) vs new "
          "(2 x fused baseline + floor); 4 heads, d64, causal")
    print(f"{'dtype':<6}{'S':>6}{'tensor':>8}{'naive err':>11}{'fused err':>11}{'old bound':>11}"
          f"{'new bound':>11}{'tighter':>9}")
    naive = get_backend("naive")
    for dtype in ("fp32", "fp16", "bf16"):
        for s in lengths:
            case = make_case("b", dict(backend="naive", seqlen_q=s, heads_q=4, head_dim=64,
                                       mask="causal", dtype=dtype))
            spec = AttnSpec.from_case(case)
            q, k, v, dout = make_inputs(case)
            refs = References(q, k, v, dout, spec)
            fwd = naive.forward(q, k, v, spec)
            n = refs.errors(dict(zip(TENSORS, (fwd.out, *naive.backward(fwd.ctx, dout)))),
                            hash_keep_mask)
            out, lse = fused_forward(q, k, v, spec)
            f = refs.errors(dict(zip(TENSORS, (out, *fused_backward(q, k, v, out, lse, dout,
                                                                     spec)))), hash_keep_mask)
            for t in TENSORS:
                old = acc.RATIO_FACTOR * n[t]["rel_l2"] + acc.RATIO_FLOOR[dtype]
                new = acc.FUSED_FACTOR * f[t]["rel_l2"] + acc.FUSED_FLOOR[dtype]
                print(f"{dtype:<6}{s:>6}{t:>8}{n[t]['rel_l2']:>11.3g}{f[t]['rel_l2']:>11.3g}"
                      f"{old:>11.3g}{new:>11.3g}{old / new:>8.2f}x")


def sensitivity(lengths, widths) -> None:
    print("\nPart 2: accumulator widths on the ladder (1 head, d64, bf16 inputs): worst "
          "value/bound of the per-case check, trend slope / SLOPE_BOUND")
    print(f"{'accumulator':<14}{'bits':>5}{'worst case':>12}{'trend':>8}  caught by")
    for which in ("pv", "dq"):
        tensor = "out" if which == "pv" else "dq"
        for bits in widths:
            model = NarrowAccumulators(**{f"{which}_bits": bits})
            series = Series(which, tensor, (), which)
            worst = 0.0
            for s in lengths:
                case = make_case("b", dict(backend="x", seqlen_q=s, heads_q=1, head_dim=64,
                                           dtype="bf16"))
                mine, base = errors(model, case)
                bound, _ = acc.ratio_bound("bf16", "fused", base[tensor]["rel_l2"], 0.0)
                worst = max(worst, mine[tensor]["rel_l2"] / bound)
                series.points.append(Point(s, mine[tensor]["rel_l2"], base[tensor]["rel_l2"]))
            trend = fit(series)
            slope = trend.slope / SLOPE_BOUND if trend else float("nan")
            by = [name for name, hit in (("case bound", worst > 1),
                                         ("trend", trend is not None and trend.finding)) if hit]
            print(f"{which:<14}{bits:>5}{worst:>12.2f}{slope:>8.2f}  {', '.join(by) or '-'}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    t0 = time.time()
    torch.set_num_threads(1)
    bounds_table([256, 1024] if args.quick else [256, 1024, 4096])
    ladder = [512, 1024, 2048] if args.quick else [512, 1024, 2048, 4096, 8192]
    sensitivity(ladder, [8, 9, 10, 11, 12, 14])
    print(f"\n{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
