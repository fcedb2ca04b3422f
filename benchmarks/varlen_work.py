"""How much work does packing save, and what does a packed case cost to judge?

    python benchmarks/varlen_work.py                  # the mixes of sweeps/varlen_gpu.yaml
    python benchmarks/varlen_work.py --judge          # + fp64 reference / naive time on CPU

Part 1 (arithmetic only) -- for lognormal length mixes (mean 2048, max 16384, as the GPU sweep
draws them) and the issue's explicit mix: the number of documents, the longest, and the FLOPs of
the packed case (each document's own pairs, attnbench.sweep.flops) against two ways of not packing:
padding every document to the longest (a dense batch x max_len case) and attending across
documents (one dense sequence of the whole pack, causal). The ratios are the throughput a
kernel that pads, or leaks, wastes on FLOPs that are not the case's; the dashboard's packed
panel counts only the packed figure.

Part 2 (``--judge``, CPU) -- seconds to compute the fp64 reference and the naive baseline of a
small packed case per document against the same tokens as one dense sequence: judging a pack
costs a loop over documents, not more.
"""

from __future__ import annotations

import argparse
import time

from attnbench.sweep.case import make_case
from attnbench.sweep.flops import case_flops

MIXES = [{"lengths": "lognormal", "mean": 2048, "max": 16384, "total": total, "seed": 0}
         for total in (16384, 32768, 65536, 131072)]


def work_table(causal: bool) -> None:
    mask = "causal" if causal else "none"
    print(f"\nmask={mask}, 16 heads, d128 (TFLOP per forward)")
    print(f"{'mix':>28} {'docs':>5} {'longest':>8} {'packed':>9} {'padded':>9} {'x':>6} "
          f"{'one seq':>9} {'x':>6}")
    cases = [("issue [4096,1024,77,2999]", {"seqlens_q": [4096, 1024, 77, 2999]})]
    cases += [(f"lognormal total {m['total']}", {"varlen": m}) for m in MIXES]
    for label, fields in cases:
        from attnbench.sweep.load import parse_sweep  # noqa: PLC0415  (expands varlen like a sweep)

        text = ("name: w\ndefaults: {backend: naive, heads_q: 16, head_dim: 128, mask: "
                f"{mask}}}\naxes: {{dtype: [bf16]}}\ninclude: [{_yaml(fields)}]\n")
        case = parse_sweep(text, "w.yaml").cases[-1]
        longest = max(case.seqlens_q)
        packed = case_flops(case)[0]
        padded = case_flops(make_case("w", {"backend": "naive", "batch": case.batch,
                                            "seqlen_q": longest, "heads_q": 16,
                                            "head_dim": 128, "mask": mask}))[0]
        one = case_flops(make_case("w", {"backend": "naive", "seqlen_q": case.seqlen_q,
                                         "heads_q": 16, "head_dim": 128, "mask": mask}))[0]
        print(f"{label:>28} {case.batch:>5} {longest:>8} {packed / 1e12:>9.3f} "
              f"{padded / 1e12:>9.3f} {padded / packed:>6.1f} {one / 1e12:>9.3f} "
              f"{one / packed:>6.1f}")


def _yaml(fields: dict) -> str:
    import json

    return json.dumps(fields)  # JSON is YAML


def judge_times() -> None:
    import torch

    from attnbench.backends import get_backend
    from attnbench.problem.inputs import make_inputs
    from attnbench.problem.attn_spec import AttnSpec
    from attnbench.problem.reference import reference_backward, reference_forward

    torch.set_num_threads(1)
    print("\nCPU seconds to judge (fp64 reference fwd+bwd, naive fwd+bwd), 4 heads, d64, causal")
    shapes = (("packed [700, 1, 300, 47]", {"seqlens_q": [700, 1, 300, 47]}),
              ("dense 1048", {"seqlen_q": 1048}))
    # The first round warms up (a process's first bf16 backward took ~10 s here), the second
    # is printed.
    for round_no, (label, fields) in enumerate(shapes + shapes):
        case = make_case("j", {"backend": "naive", "heads_q": 4, "head_dim": 64,
                               "mask": "causal", "dtype": "bf16", **fields})
        spec = AttnSpec.from_case(case)
        q, k, v, dout = make_inputs(case)
        t0 = time.perf_counter()
        out, lse = reference_forward(q, k, v, spec)
        reference_backward(q, k, v, out, lse, dout, spec)
        t1 = time.perf_counter()
        naive = get_backend("naive")
        fwd = naive.forward(q, k, v, spec)
        naive.backward(fwd.ctx, dout)
        t2 = time.perf_counter()
        if round_no >= len(shapes):
            print(f"{label:>28}: reference {t1 - t0:6.2f} s   naive {t2 - t1:6.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--judge", action="store_true", help="also time judging on this CPU")
    args = parser.parse_args()
    for causal in (False, True):
        work_table(causal)
    if args.judge:
        judge_times()


if __name__ == "__main__":
    main()
