"""naive's two correct backwards side by side: autograd and the flash-style recomputation from
(O, lse) (``backward_from_stats``), with the fused baseline's identity residuals -- what the
accuracy judge's naive baseline takes the worse of (attnbench/accuracy/evaluate.py).

Prints, per (dtype, input distribution), the largest ratio of the flash-style error to
autograd's for dQ, dK, dV, and the largest identity residual of each backward, over heads
4/4 and 4/1, no mask and causal, seqlen 64 and 203, seeds 0-1, dropout 0 and 0.1 (80 cases a
row):

    python benchmarks/sink_baselines.py [--dtypes bf16,fp16,fp32]
"""

from __future__ import annotations

import argparse
import collections
import itertools

import torch

from attnbench.accuracy.evaluate import References
from attnbench.accuracy.fused_baseline import fused_backward, fused_forward
from attnbench.accuracy.invariants import identity_residuals
from attnbench.backends import get_backend
from attnbench.problem.attn_spec import AttnSpec
from attnbench.problem.dropout import hash_keep_mask
from attnbench.problem.inputs import make_inputs
from attnbench.sweep.case import make_case

INPUTS = ("normal", "large_logits", "outliers", "loud_heads", "sink")
GRADS = ("dq", "dk", "dv")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default="bf16")
    args = parser.parse_args()
    torch.set_num_threads(1)
    naive = get_backend("naive")
    worst: dict[tuple, float] = collections.defaultdict(float)
    for dtype, inputs, hkv, mask, s, seed, drop in itertools.product(
            args.dtypes.split(","), INPUTS, [4, 1], ["none", "causal"], [64, 203], [0, 1],
            [0.0, 0.1]):
        case = make_case("sink_baselines", dict(
            backend="sdpa", dtype=dtype, seed=seed, seqlen_q=s, heads_q=4, heads_kv=hkv,
            head_dim=64, mask=mask, inputs=inputs, dropout=drop))
        spec = AttnSpec.from_case(case)
        q, k, v, dout = make_inputs(case)
        refs = References(q, k, v, dout, spec)
        fwd = naive.forward(q, k, v, spec)
        ways = {"autograd": naive.backward(fwd.ctx, dout),
                "flash-style": naive.backward_from_stats(q, k, v, fwd.out, fwd.lse, dout, spec)}
        errors = {name: refs.errors(dict(zip(("out", *GRADS), (fwd.out, *g))), naive.keep_mask)
                  for name, g in ways.items()}
        row = (dtype, inputs)
        for t in GRADS:
            ratio = errors["flash-style"][t]["rel_l2"] / errors["autograd"][t]["rel_l2"]
            worst[row + (f"{t} flash/autograd",)] = max(worst[row + (f"{t} flash/autograd",)],
                                                        ratio)
        out, lse = fused_forward(q, k, v, spec, keep_mask=hash_keep_mask)
        ways["fused"] = fused_backward(q, k, v, out, lse, dout, spec, keep_mask=hash_keep_mask)
        for name, grads in ways.items():
            found = identity_residuals(q, k, v, out if name == "fused" else fwd.out, dout,
                                       *grads)
            for identity, value in found.items():
                key = row + (f"{identity} {name}",)
                worst[key] = max(worst[key], value)
    columns = sorted({key[2] for key in worst})
    print("dtype inputs " + " | ".join(columns))
    for row in sorted({key[:2] for key in worst}):
        print(*row, " | ".join(f"{worst[row + (c,)]:.3g}" for c in columns))


if __name__ == "__main__":
    main()
