"""Peak memory and time of the fused-precision baseline, and its error beside other backends'.

    python benchmarks/baseline_memory.py [--lengths 16384,65536] [--error-lengths 256,1024,4096]
        [--quick] [--no-memory] [--no-errors]

Memory: forward + backward of :mod:`attnbench.accuracy.fused_baseline` at each length (1 head, d64,
bf16, causal and not), each in a fresh subprocess so that the peak resident memory (``ru_maxrss``)
belongs to that length alone; on a GPU also ``torch.cuda.max_memory_allocated``. Printed next
to one S x S bf16 matrix, the least a dense (naive) implementation needs.

Errors: relative L2 error against the fp64 reference of the baseline, ``naive``, ``sdpa`` and
``triton`` for fp16 / bf16 (4 heads, d64, causal, normal inputs, seed 0). On the CPU ``triton``
runs in the interpreter (slow, and it casts fp32 -> bf16 by truncation: see
benchmarks/fused_error_ratios.py), so only up to ``--triton-max`` tokens.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

from attnbench.accuracy.bounds import tensor_errors
from attnbench.accuracy.fused_baseline import FusedBaseline
from attnbench.backends import get_backend
from attnbench.problem.attn_spec import AttnSpec
from attnbench.problem.inputs import make_inputs
from attnbench.problem.reference import reference_backward, reference_forward
from attnbench.sweep.case import make_case

TENSORS = ("out", "dq", "dk", "dv")
HEAD_DIM = 64


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def child(seqlen: int, causal: bool, device: str, threads: int) -> dict:
    """One measurement in this (fresh) process: inputs first, then forward + backward."""
    if threads:
        torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(1, 1, seqlen, HEAD_DIM, generator=gen).to(torch.bfloat16)
                     .to(device) for _ in range(4))
    spec = AttnSpec(scale=HEAD_DIM ** -0.5, seqlen_q_total=seqlen, seqlen_kv_total=seqlen,
                    window_right=0 if causal else -1)
    baseline = FusedBaseline()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    gpu_before = torch.cuda.memory_allocated() if device == "cuda" else 0
    rss_before = _rss_mib()
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0, c0 = time.perf_counter(), time.process_time()
    out, lse = baseline.forward(q, k, v, spec)
    sync()
    t1, c1 = time.perf_counter(), time.process_time()
    baseline.backward(q, k, v, out, lse, dout, spec)
    sync()
    t2, c2 = time.perf_counter(), time.process_time()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "forward_s": t1 - t0, "backward_s": t2 - t1,
        # CPU time of all threads: on a shared machine wall time also counts waiting for a core.
        "forward_cpu_s": c1 - c0, "backward_cpu_s": c2 - c1,
        # ru_maxrss is a high-water mark: what the baseline added above the process so far
        # (python, torch and the inputs), and the process's peak.
        "rss_added_mib": peak - max(peak_before, rss_before), "rss_peak_mib": peak,
        "gpu_added_mib": ((torch.cuda.max_memory_allocated() - gpu_before) / 2**20
                          if device == "cuda" else None),
        "threads": torch.get_num_threads(),
    }


def memory_table(lengths: list[int], devices: list[str], threads: int) -> None:
    print("fused baseline forward + backward, 1 head, d64, bf16 (fresh process per row)")
    print("times: wall (CPU time of all threads)")
    print(f"{'device':6} {'seqlen':>7} {'mask':6} {'forward':>17} {'backward':>17} "
          f"{'RSS added':>10} {'RSS peak':>9} {'GPU added':>10} {'S x S bf16':>11}")
    for device in devices:
        for seqlen in lengths:
            for causal in (False, True):
                started = time.perf_counter()
                proc = subprocess.run(
                    [sys.executable, __file__, "--child", str(seqlen), device,
                     "--threads", str(threads)] + (["--causal"] if causal else []),
                    capture_output=True, text=True, check=False)
                if proc.returncode:
                    print(f"{device:6} {seqlen:7} failed: {proc.stderr.strip()[-300:]}")
                    continue
                r = json.loads(proc.stdout.strip().splitlines()[-1])
                gpu = f"{r['gpu_added_mib']:8.0f} MiB" if r["gpu_added_mib"] is not None else "-"
                print(f"{device:6} {seqlen:7} {'causal' if causal else 'none':6} "
                      f"{r['forward_s']:6.1f} s ({r['forward_cpu_s']:6.1f} s) "
                      f"{r['backward_s']:6.1f} s ({r['backward_cpu_s']:6.1f} s) "
                      f"{r['rss_added_mib']:6.0f} MiB {r['rss_peak_mib']:5.0f} MiB {gpu:>10} "
                      f"{seqlen * seqlen * 2 / 2**20:7.0f} MiB   "
                      f"(wall {time.perf_counter() - started:.0f} s, {r['threads']} threads)",
                      flush=True)


def error_table(lengths: list[int], device: str, triton_max: int) -> None:
    print(f"\nrel. L2 error against fp64 on {device} (4 heads, d64, causal, normal inputs, "
          "seed 0): out / dq / dk / dv")
    names = ["fused baseline", "naive", "sdpa", "triton"]
    print(f"{'dtype':5} {'seqlen':>6}  " + "  ".join(f"{n:^35}" for n in names))
    for dtype in ("fp16", "bf16"):
        for seqlen in lengths:
            case = make_case("e", dict(backend="naive", dtype=dtype, seqlen_q=seqlen, heads_q=4,
                                       head_dim=HEAD_DIM, mask="causal"))
            q, k, v, dout = make_inputs(case, device)
            spec = AttnSpec.from_case(case)
            ref_out, ref_lse = reference_forward(q, k, v, spec)
            ref = (ref_out, *reference_backward(q, k, v, ref_out, ref_lse, dout, spec))
            baseline = FusedBaseline()
            out, lse = baseline.forward(q, k, v, spec)
            results = {"fused baseline": (out, *baseline.backward(q, k, v, out, lse, dout, spec))}
            for name in ("naive", "sdpa", "triton"):
                backend = get_backend(name)
                if name == "triton" and device == "cpu" and seqlen > triton_max:
                    continue
                if backend.supports(case.replace(backend=name), torch.device(device)):
                    continue
                fwd = backend.forward(q, k, v, spec)
                results[name] = (fwd.out, *backend.backward(fwd.ctx, dout))
            cells = []
            for name in names:
                if name not in results:
                    cells.append(f"{'-':^35}")
                    continue
                errs = [tensor_errors(x, r)["rel_l2"] for x, r in zip(results[name], ref)]
                cells.append(" ".join(f"{e:8.2e}" for e in errs))
            print(f"{dtype:5} {seqlen:6}  " + "  ".join(cells), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="16384,65536",
                        help="memory/time lengths (65536 takes minutes on a CPU)")
    parser.add_argument("--error-lengths", default="256,1024,4096")
    parser.add_argument("--quick", action="store_true", help="error lengths 256,1024 only")
    parser.add_argument("--triton-max", type=int, default=512,
                        help="longest sequence for triton under the CPU interpreter")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads (0: torch's default); on a shared machine 1 "
                             "thread avoids OpenMP barriers stalling on busy cores")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--no-errors", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("SEQLEN", "DEVICE"), help=argparse.SUPPRESS)
    parser.add_argument("--causal", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(int(args.child[0]), args.causal, args.child[1], args.threads)))
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if not args.no_memory:
        memory_table([int(s) for s in args.lengths.split(",")], devices, args.threads)
    if not args.no_errors:
        lengths = [256, 1024] if args.quick else [int(s) for s in args.error_lengths.split(",")]
        for device in devices:
            error_table(lengths, device, args.triton_max)
    print(f"\ntotal {time.perf_counter() - started:.0f} s, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")


if __name__ == "__main__":
    main()
