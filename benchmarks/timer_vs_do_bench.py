"""attnbench's timer next to ``triton.testing.do_bench`` on the same calls (GPU only).

    python benchmarks/timer_vs_do_bench.py                      # sdpa_flash and triton, bf16
    python benchmarks/timer_vs_do_bench.py --backends sdpa_cudnn --mode graph

Every row times one backend call (forward, then backward on one forward's context) twice: with
:func:`attnbench.timing.loop.measure` under the sweep defaults the GPU sweeps use, and with
``do_bench`` (CUDA events, L2 flushed before each call, median). Shapes run from a ~30 us call
to several ms, so both regimes of the target show: within 3 % at >= 1 ms, within 10 % at 50 us.
The ``ok`` column says whether the ratio meets the target of its size. On a CPU it says it needs
a GPU and exits 0 (nothing to compare: do_bench needs CUDA).
"""

from __future__ import annotations

import attnbench.kernels  # noqa: F401  (first: TRITON_INTERPRET=1 on machines without a GPU)

import argparse
import sys

import torch

from attnbench.backends import Unsupported, get_backend
from attnbench.problem.attn_spec import AttnSpec
from attnbench.problem.inputs import make_inputs
from attnbench.sweep.case import make_case
from attnbench.sweep.options import TimingOptions
from attnbench.timing.loop import make_clock, measure

# (batch, seqlen, heads, head_dim): from tens of microseconds to milliseconds on an H100/H200.
SHAPES = ((1, 256, 8, 64), (1, 1024, 16, 64), (2, 2048, 16, 128), (4, 4096, 16, 128),
          (1, 16384, 16, 128))


def target(ms: float) -> float:
    """Allowed |ratio - 1|: 3 % at >= 1 ms, 10 % at <= 50 us, linear in log time between."""
    import math

    if ms >= 1.0:
        return 0.03
    if ms <= 0.05:
        return 0.10
    frac = (math.log10(ms) - math.log10(0.05)) / (0 - math.log10(0.05))
    return 0.10 + frac * (0.03 - 0.10)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", default="sdpa_flash,triton")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--mode", choices=("eager", "graph"), default="eager")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("timer_vs_do_bench: needs a CUDA GPU (do_bench times with CUDA events); "
              "nothing to compare on this machine")
        return 0
    from triton.testing import do_bench

    device = torch.device("cuda", 0)
    options = TimingOptions(mode=args.mode, max_seconds=2.0, max_samples=200)
    clock = make_clock(device)
    print(f"# {torch.cuda.get_device_name(device)}, {args.dtype}, timer mode {args.mode}")
    print(f"{'backend':<14}{'shape':>22}{'dir':>5}{'attnbench ms':>14}{'do_bench ms':>13}"
          f"{'ratio':>8}{'calls/s':>8}{'noisy':>7}{'ok':>5}")
    worst = 0.0
    for name in args.backends.split(","):
        backend = get_backend(name)
        for batch, seqlen, heads, head_dim in SHAPES:
            case = make_case("bench", dict(backend=name, batch=batch, seqlen_q=seqlen,
                                           heads_q=heads, head_dim=head_dim, dtype=args.dtype))
            if backend.supports(case, device):
                continue
            spec = AttnSpec.from_case(case)
            q, k, v, dout = make_inputs(case, device)
            try:
                fwd = backend.forward(q, k, v, spec)  # compiles, autotunes, prepares
                backend.backward(fwd.ctx, dout)
            except Unsupported:
                continue
            calls = {"fwd": lambda: backend.forward(q, k, v, spec),
                     "bwd": lambda: backend.backward(fwd.ctx, dout)}
            for direction, fn in calls.items():
                ours = measure(fn, clock, options)
                theirs = do_bench(fn, warmup=25, rep=200, return_mode="median")
                ratio = ours.median_ms / theirs
                ok = abs(ratio - 1) <= target(theirs)
                worst = max(worst, abs(ratio - 1) / target(theirs))
                print(f"{name:<14}{f'{batch}x{seqlen}x{heads}x{head_dim}':>22}{direction:>5}"
                      f"{ours.median_ms:>14.4f}{theirs:>13.4f}{ratio:>8.3f}"
                      f"{ours.calls_per_sample:>8}{'yes' if ours.noisy else '':>7}"
                      f"{'yes' if ok else 'NO':>5}")
    print(f"# worst |ratio - 1| / target: {worst:.2f} (<= 1 meets the targets)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
