"""Input tensors for a case: the same numbers on every device and every rerun.

Drawn in fp32 on the CPU from a generator seeded by the case seed, rounded to the case's dtype,
then moved to the device; the fp64 reference starts from those same rounded values.

Distributions:
  normal        q, k, v, dout ~ N(0, 1)
  large_logits  q and k ~ N(0, 3^2): scaled scores have std ~9 and reach ~40, where an
                exp() without the running max overflows fp16 (max e^11) and strains bf16 sums
  outliers      N(0, 1) with a few whole channels (feature dims) scaled, like the activation
                outliers of large language models: x20 in v (stresses the P @ V accumulation)
                and x4 in q and k (logits ~16x larger on those channels; x20 there made
                logits of several hundred, where even bf16 inputs carry no usable softmax)
"""

from __future__ import annotations

import torch

from attnbench.packing import tensor_batch
from attnbench.spec import Case

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def torch_dtype(name: str) -> torch.dtype:
    return TORCH_DTYPES[name]


def make_inputs(case: Case, device: torch.device | str = "cpu"):
    """Return (q, k, v, dout) in the case's dtype on ``device``; shapes (B, H, S, D), for a
    packed case (1, H, total tokens, D) (:mod:`attnbench.packing`)."""
    gen = torch.Generator(device="cpu").manual_seed(case.seed)
    batch = tensor_batch(case)  # a packed case is one buffer of seqlen_q tokens
    shapes = {
        "q": (batch, case.heads_q, case.seqlen_q, case.head_dim),
        "k": (batch, case.heads_kv, case.seqlen_kv, case.head_dim),
        "v": (batch, case.heads_kv, case.seqlen_kv, case.head_dim_v),
        "dout": (batch, case.heads_q, case.seqlen_q, case.head_dim_v),
    }
    tensors = {name: torch.randn(shape, generator=gen) for name, shape in shapes.items()}
    if case.inputs == "large_logits":
        tensors["q"] *= 3.0
        tensors["k"] *= 3.0
    elif case.inputs == "outliers":
        for name, factor in (("q", 4.0), ("k", 4.0), ("v", 20.0)):
            t = tensors[name]
            n_out = max(1, t.shape[-1] // 32)
            channels = torch.randperm(t.shape[-1], generator=gen)[:n_out]
            t[..., channels] *= factor
    dtype = torch_dtype(case.dtype)
    return tuple(tensors[n].to(dtype).to(device) for n in ("q", "k", "v", "dout"))
