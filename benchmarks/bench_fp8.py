"""Forward TFLOP/s of our Triton kernel in fp8 (``flash_forward_fp8``) next to its bf16 forward.

    python benchmarks/bench_fp8.py                             # 16k tokens, hidden 2048
    python benchmarks/bench_fp8.py --seqlen 8192 --head-dim 128 --no-causal
    python benchmarks/bench_fp8.py --cpu-smoke                 # tiny shapes, interpreter

GPU only (fp8 tensor cores: compute capability >= 8.9); without one it says so and exits 2
(``--cpu-smoke`` runs the script's path in the interpreter: no speed). Shapes as in
``bench_triton.py`` (the FlashAttention papers' grid: batch x seqlen = ``--tokens``, heads x
head_dim = ``--hidden``). Rows:

* ``bf16``: :func:`flash_forward` on bf16 q, k, v;
* ``fp8 e4m3`` / ``fp8 e5m2``: :func:`flash_forward_fp8`, bf16 output, per-head descales, V
  stored (B, H, Sk, D) like q and k;
* ``... vT``: the same with V stored key-contiguous, (B, H, D, Sk) viewed as (B, H, Sk, D)
  (the kernel takes any strides). Hopper's fp8 wgmma wants its B operand K-major; with V
  D-contiguous Triton transposes each V tile through registers and shared memory (the sm_90
  PTX of the d128 forward has 109 shared stores per loop against 13 with V key-contiguous:
  kernels/compile_check.py), which is why Triton's tutorial and FA3 keep fp8 V transposed.

FLOPs: 4 * B * H * Sq * Sk * D (halved when causal), the forward of :mod:`attnbench.sweep.flops`.
Timing: ``triton.testing.do_bench`` (median, L2 flushed); the first call of a shape autotunes
and is not timed. Inputs are quantized outside the timed region (a model hands fp8 tensors).
"""

from __future__ import annotations

import attnbench.kernels  # noqa: F401  (first: TRITON_INTERPRET=1 on machines without a GPU)

import argparse
import itertools
import sys

import torch

from attnbench.kernels.flash_fwd import FP8_MIN_CAPABILITY, flash_forward, flash_forward_fp8
from attnbench.kernels.params import FlashParams
from attnbench.problem.fp8 import FORMATS, quantize
from attnbench.timing.bench import bench_ms

VARIANTS = ("bf16", "fp8 e4m3", "fp8 e4m3 vT", "fp8 e5m2", "fp8 e5m2 vT")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"subset of {VARIANTS}")
    p.add_argument("--seqlen", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--head-dim", type=int, nargs="+", default=[64, 128])
    p.add_argument("--causal", dest="causal", action="store_const", const=(True,),
                   default=(False, True), help="causal only (default: both)")
    p.add_argument("--no-causal", dest="causal", action="store_const", const=(False,),
                   help="non-causal only")
    p.add_argument("--tokens", type=int, default=16384, help="batch x seqlen")
    p.add_argument("--hidden", type=int, default=2048, help="heads x head_dim")
    p.add_argument("--rep-ms", type=int, default=200, help="do_bench time budget per sample set")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="tiny shapes in the interpreter (checks the script, not the speed)")
    args = p.parse_args(argv)
    args.variants = tuple(args.variants.split(","))
    unknown = set(args.variants) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variants {sorted(unknown)}; choose from {VARIANTS}")
    if args.cpu_smoke:
        args.seqlen, args.head_dim, args.tokens, args.hidden = [64], [32], 64, 64
    return args


def key_contiguous(v: torch.Tensor) -> torch.Tensor:
    """The same (B, H, Sk, D) values stored (B, H, D, Sk)."""
    return v.transpose(-1, -2).contiguous().transpose(-1, -2)


def make_call(variant: str, q, k, v, params: FlashParams):
    """A no-argument forward of ``variant`` on fp32 q, k, v (quantized here, not timed)."""
    if variant == "bf16":
        q16, k16, v16 = (x.to(torch.bfloat16) for x in (q, k, v))
        return lambda: flash_forward(q16, k16, v16, params)
    fmt = FORMATS["fp8_e4m3" if "e4m3" in variant else "fp8_e5m2"]
    heads_kv = k.shape[1]
    b, hq, sq, d = q.shape
    qq = quantize(q.reshape(b, heads_kv, (hq // heads_kv) * sq, d), fmt, per_head=True)
    q8 = qq.values.reshape(b, hq, sq, d)
    kq, vq = quantize(k, fmt, per_head=True), quantize(v, fmt, per_head=True)
    v8 = key_contiguous(vq.values) if variant.endswith("vT") else vq.values
    descales = (qq.descale, kq.descale, vq.descale)
    return lambda: flash_forward_fp8(q8, kq.values, v8, params, *descales)


def run(args) -> int:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not args.cpu_smoke:
        print("bench_fp8: no GPU. fp8 speed needs a CUDA GPU with compute capability >= "
              f"{FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]} (Ada, Hopper or later); pass "
              "--cpu-smoke to check the script in the interpreter", file=sys.stderr)
        return 2
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < FP8_MIN_CAPABILITY:
        print(f"bench_fp8: {torch.cuda.get_device_name(device)} has no fp8 tensor cores "
              f"(compute capability {torch.cuda.get_device_capability(device)} < "
              f"{FP8_MIN_CAPABILITY})", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter)"
    print(f"# {name}, forward, {args.tokens} tokens, hidden {args.hidden}, bf16 output")
    print(f"{'variant':<14}{'seqlen':>7}{'batch':>6}{'heads':>6}{'hdim':>5}{'causal':>7}"
          f"{'fwd ms':>10}{'fwd TF/s':>10}{'vs bf16':>9}")
    gen = torch.Generator(device=device).manual_seed(0)
    for seqlen, head_dim, causal in itertools.product(args.seqlen, args.head_dim, args.causal):
        batch, heads = max(1, args.tokens // seqlen), max(1, args.hidden // head_dim)
        q, k, v = (torch.randn(batch, heads, seqlen, head_dim, device=device, generator=gen)
                   for _ in range(3))
        params = FlashParams(sm_scale=head_dim ** -0.5, window_right=0 if causal else -1)
        flops = 4 * batch * heads * seqlen * seqlen * head_dim * (0.5 if causal else 1.0)
        bf16_ms = None
        for variant in args.variants:
            row = (f"{variant:<14}{seqlen:>7}{batch:>6}{heads:>6}{head_dim:>5}"
                   f"{'yes' if causal else 'no':>7}")
            try:
                call = make_call(variant, q, k, v, params)
                call()  # compiles and autotunes: not timed
                ms = bench_ms(call, device, args.rep_ms)
            except torch.OutOfMemoryError:
                print(f"{row}  out of memory")
                continue
            if variant == "bf16":
                bf16_ms = ms
            ratio = f"{bf16_ms / ms:>8.2f}x" if bf16_ms else f"{'':>9}"
            print(f"{row}{ms:>10.3f}{flops / ms / 1e9:>10.1f}{ratio}", flush=True)
        del q, k, v
    return 0


if __name__ == "__main__":
    sys.exit(run(parse_args()))
