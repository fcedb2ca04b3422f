"""How much of an fp8 case's error is quantization and how much is the kernel.

An fp8 backend is given q, k, v already rounded to fp8 (:mod:`attnbench.problem.fp8`): its output
differs from exact attention on the user's numbers for two reasons. Three figures separate them,
each a relative L2 error of the output (fp64 references, :mod:`attnbench.problem.reference`):

* ``kernel``: the backend against exact attention on the *dequantized* fp8 inputs -- what the
  kernel itself can be blamed for; this is the figure the verdict judges (against the fused fp8
  baseline, :class:`attnbench.accuracy.fused_baseline.FusedBaseline` with ``p_format``);
* ``quantization``: exact attention on the dequantized inputs against exact attention on the
  fp32 originals -- what rounding q, k, v to fp8 costs before any kernel runs;
* ``end_to_end``: the backend against exact attention on the originals -- what the user gets.

Plus each input's own quantization error (``inputs``), and ``accumulation_rel_l2``: what a
correct kernel whose fp8 tensor cores keep 13 mantissa bits in their accumulator would show at
the case's ``fp8_promotion`` (:mod:`attnbench.accuracy.fp8_accumulation`) -- on a GPU, a
``kernel`` figure that follows it rather than the fused baseline's is the accumulator's loss. TransformerEngine's fp8 tests compare
against an fp16 run by RMSE and FA3's against a reference that already rounds: neither splits
these, and a kernel bug hides behind the quantization error unless they are split.
"""

from __future__ import annotations

from typing import Sequence

import torch

from attnbench.accuracy.bounds import _finite_or_none, problem_scale, tensor_errors
from attnbench.accuracy.fp8_accumulation import modeled_forward
from attnbench.problem.reference import reference_forward


def quantization_split(case, spec, out: torch.Tensor, exact_dequantized: dict,
                       dequantized: Sequence[torch.Tensor],
                       originals: Sequence[torch.Tensor]) -> dict:
    """The record's ``accuracy.fp8`` section. ``exact_dequantized``: the fp64 reference of the
    dequantized inputs ({"out": ...}, already computed for the verdict); ``dequantized`` /
    ``originals``: q, k, v as given to the kernel and before quantization."""
    q, k, v = (t.to(torch.float64) for t in originals)
    exact_out, _ = reference_forward(q, k, v, spec)
    exact = {"out": exact_out}
    scale = problem_scale(exact)

    def rel(x: torch.Tensor, ref: torch.Tensor) -> float | None:
        return _finite_or_none(tensor_errors(x, ref, scale)["rel_l2"])

    return {
        "format": case.dtype,
        "scaling": case.fp8_scaling,
        "kernel_rel_l2": rel(out, exact_dequantized["out"]),
        "quantization_rel_l2": rel(exact_dequantized["out"], exact_out),
        "end_to_end_rel_l2": rel(out, exact_out),
        "inputs": {name: rel(d, o) for name, d, o in zip("qkv", dequantized, originals)},
        "promotion": case.fp8_promotion,
        "accumulation_rel_l2": rel(modeled_forward(spec, dequantized, case.fp8_promotion),
                                   exact_dequantized["out"]),
    }
