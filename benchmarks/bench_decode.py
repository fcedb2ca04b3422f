"""Decode latency and achieved GB/s of the ``triton`` split-KV kernel next to flash-attn's
``flash_attn_with_kvcache`` and SDPA, contiguous and paged caches.

    python benchmarks/bench_decode.py                        # Llama-3-8B layer, cache 1k..1M
    python benchmarks/bench_decode.py --seqlen-kv 65536 --page-size 0 16 256 --seqlen-q 1 4
    python benchmarks/bench_decode.py --cpu-smoke            # tiny shapes, interpreter

Shapes: 32 query heads, 8 KV heads, head_dim 128, bf16, batch 2 (``--batch``). Bytes come from
:func:`attnbench.sweep.flops.decode_bytes` (each sequence's cache read once, q, out, the block
table), the model the sweeps use; % of bandwidth is against the datasheet figure of
:mod:`attnbench.hardware.peaks`. Every backend is called through the attnbench backend protocol,
exactly as the harness calls it; the paged pool and block table are built by the first
(untimed) call.

Timing is ``triton.testing.do_bench`` on GPU (CUDA events, L2 flushed before each sample,
median). On CPU (``--cpu-smoke``) the kernel runs in the interpreter: the numbers only show that
the script works. Decode is memory-bound: a good kernel reaches 70-80 % of the bandwidth on long
caches (flash-decoding's figure); short caches are bound by launch latency.
"""

from __future__ import annotations

import attnbench.kernels  # noqa: F401  (first: TRITON_INTERPRET=1 on machines without a GPU)

import argparse
import itertools
import sys

import torch

from attnbench.backends import Unsupported, get_backend, refusal
from attnbench.backends.masks import release_prepared
from attnbench.problem.attn_spec import AttnSpec
from attnbench.problem.inputs import make_inputs
from attnbench.sweep.case import make_case
from attnbench.sweep.flops import decode_bytes
from attnbench.timing.bench import bench_ms


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", default="triton,flash_attn,sdpa")
    p.add_argument("--seqlen-kv", type=int, nargs="+",
                   default=[1024, 4096, 16384, 65536, 262144, 1048576])
    p.add_argument("--seqlen-q", type=int, nargs="+", default=[1])
    p.add_argument("--page-size", type=int, nargs="+", default=[0, 256])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, nargs=2, default=[32, 8], metavar=("HQ", "HKV"))
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--rep-ms", type=int, default=100, help="do_bench time budget")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="tiny shapes in the interpreter (checks the script, not the speed)")
    args = p.parse_args(argv)
    if args.cpu_smoke:
        args.seqlen_kv, args.page_size, args.heads, args.head_dim = [64], [0, 16], [4, 2], 32
        args.backends = "triton,naive,sdpa"
    return args


def bandwidth_gbs(device: torch.device):
    if device.type != "cuda":
        return None
    from attnbench.hardware.device import device_env
    from attnbench.hardware import peak_bandwidth_gbs

    return peak_bandwidth_gbs(device_env(device)["gpu_kind"])


def run(args) -> int:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not args.cpu_smoke:
        print("bench_decode: no GPU; pass --cpu-smoke to check the script in the interpreter",
              file=sys.stderr)
        return 2
    peak = bandwidth_gbs(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter)"
    print(f"# {name}, {args.dtype}, batch {args.batch}, heads {args.heads[0]}/{args.heads[1]}, "
          f"d{args.head_dim}; peak bandwidth {peak or '?'} GB/s")
    print(f"{'backend':<12}{'kv len':>9}{'q':>3}{'page':>6}{'ms':>10}{'GB/s':>9}{'% bw':>7}")
    for seqlen_kv, seqlen_q, page in itertools.product(args.seqlen_kv, args.seqlen_q,
                                                       args.page_size):
        for backend_name in args.backends.split(","):
            row = f"{backend_name:<12}{seqlen_kv:>9}{seqlen_q:>3}{page:>6}"
            case = make_case("bench", dict(
                backend=backend_name, batch=args.batch, seqlen_q=seqlen_q, seqlen_kv=seqlen_kv,
                heads_q=args.heads[0], heads_kv=args.heads[1], head_dim=args.head_dim,
                dtype=args.dtype, decode=True, mask="causal", page_size=page))
            backend = get_backend(backend_name)
            reason = refusal(backend, case, device)  # as the single-device runner asks
            if reason:
                print(f"{row}  unsupported: {reason}")
                continue
            spec = AttnSpec.from_case(case)
            q, k, v, _ = make_inputs(case, device)
            try:
                backend.forward(q, k, v, spec)  # builds the cache, compiles: not timed
                ms = bench_ms(lambda: backend.forward(q, k, v, spec), device, args.rep_ms)
            except Unsupported as exc:
                print(f"{row}  unsupported: {exc}")
                continue
            except torch.OutOfMemoryError:
                print(f"{row}  out of memory")
                continue
            finally:
                release_prepared(backend)
            gbs = decode_bytes(case) / ms / 1e6
            pct = f"{100 * gbs / peak:>7.1f}" if peak else f"{'-':>7}"
            print(f"{row}{ms:>10.4f}{gbs:>9.1f}{pct}", flush=True)
            del q, k, v
    return 0


if __name__ == "__main__":
    sys.exit(run(parse_args()))
