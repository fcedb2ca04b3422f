"""The modeled cost of the sm_90 fp8 accumulator, by keys and promotion interval (issue 39).

    python benchmarks/fp8_accumulation.py [--keys 512 2048 8192] [--inputs normal shifted_v]

For each length: the relative L2 error of the fused fp8 baseline (fp32 accumulation) and of
:class:`attnbench.accuracy.fp8_accumulation.TensorCoreAccumulation` (13-bit MMA accumulator)
unpromoted and promoted every 32 / 64 / 128 products, against the fp64 reference of the same
dequantized fp8 inputs; 1 query block of 128 rows (the error is per row), 2 heads, d128,
non-causal, e4m3. A CPU model, not a GPU measurement.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from attnbench.accuracy.bounds import problem_scale, tensor_errors  # noqa: E402
from attnbench.accuracy.fp8_accumulation import modeled_forward  # noqa: E402
from attnbench.accuracy.fused_baseline import FusedBaseline  # noqa: E402
from attnbench.problem.attn_spec import AttnSpec  # noqa: E402
from attnbench.problem.fp8 import FORMATS, dequantize_call, output_dtype, with_descales  # noqa: E402
from attnbench.problem.inputs import make_fp8_inputs  # noqa: E402
from attnbench.problem.reference import reference_forward  # noqa: E402
from attnbench.sweep.case import make_case  # noqa: E402


def row(keys: int, inputs: str, dtype: str) -> list[float]:
    case = make_case("fp8_accumulation", dict(backend="triton", dtype=dtype, seqlen_q=128,
                                              seqlen_kv=keys, heads_q=2, head_dim=128,
                                              inputs=inputs))
    fp8 = make_fp8_inputs(case, torch.device("cpu"))
    spec = with_descales(AttnSpec.from_case(case), fp8.q, fp8.k, fp8.v, case.dtype)
    q, k, v, _ = fp8.tensors
    exact64 = dequantize_call(q, k, v, spec, torch.float64)
    ref, _ = reference_forward(*exact64, spec)
    scale = problem_scale({"out": ref})

    def err(out):
        return tensor_errors(out, ref, scale)["rel_l2"]

    base = FusedBaseline(p_format=FORMATS[spec.fp8_format], out_dtype=output_dtype(spec.fp8_format))
    figures = [err(base.forward(*(t.to(torch.float32) for t in exact64), spec)[0])]
    figures += [err(modeled_forward(spec, exact64, n)) for n in (0, 32, 64, 128)]
    return figures


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--inputs", nargs="+", default=["normal"])
    parser.add_argument("--dtype", default="fp8_e4m3")
    args = parser.parse_args()
    print(f"{'inputs':10} {'keys':>6} {'fp32 acc':>9} {'13b none':>9} {'p32':>9} {'p64':>9} "
          f"{'p128':>9} {'none/fp32':>9}")
    for inputs in args.inputs:
        for keys in args.keys:
            t0 = time.perf_counter()
            f = row(keys, inputs, args.dtype)
            print(f"{inputs:10} {keys:6d} " + " ".join(f"{x:9.3e}" for x in f)
                  + f" {f[1] / f[0]:9.2f}   ({time.perf_counter() - t0:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
