"""Peak memory and time of the fp64 reference (forward + backward).

    python benchmarks/reference_memory.py [--seqlen 16384] [--heads 1] [--head-dim 64]

Prints the peak resident memory the reference added (ru_maxrss delta) next to what one full
S x S fp64 score matrix would take.
"""

from __future__ import annotations

import argparse
import resource
import time

import torch

from attnbench.problem.attn_spec import AttnSpec
from attnbench.problem.reference import reference_backward, reference_forward


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args()
    s, h, d = args.seqlen, args.heads, args.head_dim
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(1, h, s, d, generator=gen, dtype=torch.float64) for _ in range(4))
    spec = AttnSpec(scale=d ** -0.5, seqlen_q_total=s, seqlen_kv_total=s,
                    window_right=0 if args.causal else -1)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    out, lse = reference_forward(q, k, v, spec)
    t1 = time.perf_counter()
    reference_backward(q, k, v, out, lse, dout, spec)
    t2 = time.perf_counter()
    peak_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
    full_mib = s * s * 8 * h / 2**20
    print(f"seqlen {s}, heads {h}, head_dim {d}{' causal' if args.causal else ''}: "
          f"forward {t1 - t0:.1f} s, backward {t2 - t1:.1f} s, "
          f"peak memory added {peak_mib:.0f} MiB (one S x S fp64 matrix: {full_mib:.0f} MiB), "
          f"torch threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
