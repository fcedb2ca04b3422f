"""How much an fp8 forward loses when P is not pre-scaled before its fp8 rounding.

Prints, per input distribution and length, the relative L2 error of the fused fp8 model's output
(FusedBaseline with p_format) against exact attention on the same dequantized inputs, with P
pre-scaled by attnbench.problem.fp8.P_PRESCALE and without (p_prescale=1), and their ratio: the
margin by which the fused rule (2 x the baseline) catches the missing pre-scale.

    python benchmarks/fp8_prescale.py [--lengths 96 256 1024 4096] [--format fp8_e4m3]
"""

from __future__ import annotations

import argparse

import torch

from attnbench.accuracy.bounds import tensor_errors
from attnbench.accuracy.fused_baseline import FusedBaseline
from attnbench.problem.attn_spec import AttnSpec
from attnbench.problem.fp8 import FORMATS, dequantize_call, with_descales
from attnbench.problem.inputs import make_fp8_inputs
from attnbench.problem.reference import reference_forward
from attnbench.sweep.case import make_case


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[96, 256, 1024, 4096])
    parser.add_argument("--format", choices=sorted(FORMATS), default="fp8_e4m3")
    args = parser.parse_args()
    fmt = FORMATS[args.format]
    print(f"{'inputs':<13}{'seqlen':>7}{'pre-scaled':>12}{'not':>10}{'ratio':>8}")
    for inputs in ("normal", "large_logits", "sink"):
        for seqlen in args.lengths:
            case = make_case("bench", dict(backend="naive", seqlen_q=seqlen, heads_q=2,
                                           heads_kv=1, head_dim=64, dtype=args.format,
                                           mask="causal", inputs=inputs))
            fp8 = make_fp8_inputs(case)
            spec = with_descales(AttnSpec.from_case(case), fp8.q, fp8.k, fp8.v, case.dtype)
            q, k, v = dequantize_call(*fp8.tensors[:3], spec, torch.float32)
            exact, _ = reference_forward(q.double(), k.double(), v.double(), spec)
            errors = []
            for prescale in (FusedBaseline.p_prescale, 1.0):
                model = FusedBaseline(p_format=fmt, out_dtype=torch.bfloat16,
                                      p_prescale=prescale)
                errors.append(tensor_errors(model.forward(q, k, v, spec)[0], exact)["rel_l2"])
            print(f"{inputs:<13}{seqlen:>7}{errors[0]:>12.4g}{errors[1]:>10.4g}"
                  f"{errors[1] / errors[0]:>8.2f}")


if __name__ == "__main__":
    main()
