"""Forward and backward TFLOP/s of the ``triton`` backend next to PyTorch's SDPA kernels.

    python benchmarks/bench_triton.py                          # the FlashAttention-paper grid
    python benchmarks/bench_triton.py --seqlen 16384 --head-dim 128 --no-causal
    python benchmarks/bench_triton.py --cpu-smoke              # tiny shapes, interpreter

Shapes follow the FlashAttention papers so numbers compare with published ones: batch x seqlen
= ``--tokens`` (16k), heads x head_dim = ``--hidden`` (2048), bf16. FLOPs come from
:func:`attnbench.sweep.flops.case_flops` (backward = 2.5 x forward), the same model the sweeps use.
Every backend is called through the attnbench backend protocol, exactly as the harness calls it.

Timing is ``triton.testing.do_bench`` on GPU (CUDA events, the L2 cache flushed before each
sample, median of the samples); the first call of each shape includes autotuning and is not
timed. On CPU (``--cpu-smoke``) the kernels run in the interpreter: the numbers only show that
the script works, not speed. The goal on H100/H200, bf16, d128, 16k, non-causal: triton
forward >= 400 TFLOP/s, backward >= 250.
"""

from __future__ import annotations

import attnbench.kernels  # noqa: F401  (first: TRITON_INTERPRET=1 on machines without a GPU)

import argparse
import itertools
import sys
from dataclasses import dataclass

import torch

from attnbench.backends import Unsupported, get_backend
from attnbench.problem.attn_spec import AttnSpec
from attnbench.problem.inputs import make_inputs
from attnbench.sweep.case import make_case
from attnbench.sweep.flops import case_flops
from attnbench.timing.bench import bench_ms


@dataclass(frozen=True)
class Axes:
    """What is swept: declared apart from the timed body."""

    backends: tuple[str, ...]
    seqlens: tuple[int, ...]
    head_dims: tuple[int, ...]
    causal: tuple[bool, ...]
    dtype: str
    tokens: int
    hidden: int


def parse_args(argv=None) -> tuple[Axes, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", default="triton,sdpa_flash,sdpa_cudnn,sdpa_efficient")
    p.add_argument("--seqlen", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    p.add_argument("--head-dim", type=int, nargs="+", default=[64, 128])
    p.add_argument("--causal", dest="causal", action="store_const", const=(True,),
                   default=(False, True), help="causal only (default: both)")
    p.add_argument("--no-causal", dest="causal", action="store_const", const=(False,),
                   help="non-causal only")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--tokens", type=int, default=16384, help="batch x seqlen")
    p.add_argument("--hidden", type=int, default=2048, help="heads x head_dim")
    p.add_argument("--rep-ms", type=int, default=200, help="do_bench time budget per sample set")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="tiny shapes in the interpreter (checks the script, not the speed)")
    args = p.parse_args(argv)
    if args.cpu_smoke:
        args.seqlen, args.head_dim, args.tokens, args.hidden = [128], [32], 128, 64
        args.backends = "triton,sdpa"
    axes = Axes(tuple(args.backends.split(",")), tuple(args.seqlen), tuple(args.head_dim),
                tuple(args.causal), args.dtype, args.tokens, args.hidden)
    return axes, args


def run(axes: Axes, args) -> int:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not args.cpu_smoke:
        print("bench_triton: no GPU; pass --cpu-smoke to check the script in the interpreter",
              file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter)"
    print(f"# {name}, {axes.dtype}, {axes.tokens} tokens, hidden {axes.hidden}")
    print(f"{'backend':<16}{'seqlen':>7}{'batch':>6}{'heads':>6}{'hdim':>5}{'causal':>7}"
          f"{'fwd ms':>10}{'fwd TF/s':>10}{'bwd ms':>10}{'bwd TF/s':>10}")
    for seqlen, head_dim, causal in itertools.product(axes.seqlens, axes.head_dims, axes.causal):
        batch, heads = max(1, axes.tokens // seqlen), max(1, axes.hidden // head_dim)
        for backend_name in axes.backends:
            case = make_case("bench", dict(backend=backend_name, batch=batch, seqlen_q=seqlen,
                                           heads_q=heads, head_dim=head_dim, dtype=axes.dtype,
                                           mask="causal" if causal else "none"))
            row = (f"{backend_name:<16}{seqlen:>7}{batch:>6}{heads:>6}{head_dim:>5}"
                   f"{'yes' if causal else 'no':>7}")
            backend = get_backend(backend_name)
            reason = backend.supports(case, device)
            if reason:
                print(f"{row}  unsupported: {reason}")
                continue
            spec = AttnSpec.from_case(case)
            q, k, v, dout = make_inputs(case, device)
            try:
                fwd = backend.forward(q, k, v, spec)  # compiles and autotunes: not timed
                backend.backward(fwd.ctx, dout)
                fwd_ms = bench_ms(lambda: backend.forward(q, k, v, spec), device, args.rep_ms)
                bwd_ms = bench_ms(lambda: backend.backward(fwd.ctx, dout), device, args.rep_ms)
            except Unsupported as exc:
                print(f"{row}  unsupported: {exc}")
                continue
            except torch.OutOfMemoryError:
                print(f"{row}  out of memory")
                continue
            flops_fwd, flops_bwd = case_flops(case)
            print(f"{row}{fwd_ms:>10.3f}{flops_fwd / fwd_ms / 1e9:>10.1f}"
                  f"{bwd_ms:>10.3f}{flops_bwd / bwd_ms / 1e9:>10.1f}", flush=True)
            del q, k, v, dout, fwd
    return 0


if __name__ == "__main__":
    axes, args = parse_args()
    sys.exit(run(axes, args))
