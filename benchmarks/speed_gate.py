"""Does ``attnbench compare --fail-on speed`` hold on a shared CPU box? Unchanged reruns and 3x
slowdowns, each pair of runs timed in two fresh processes, judged by the gate's own rule.

    python benchmarks/speed_gate.py                      # 20 run pairs, about 5 min on 2 cores
    python benchmarks/speed_gate.py --pairs 5 --single   # also one call a sample (the old way)
    python benchmarks/speed_gate.py --load 7             # and 7 busy processes beside it
    python benchmarks/speed_gate.py --simulate           # the fence of few samples, drawn

Each run is a fresh process (as a rerun of ``attnbench run`` is: its own allocator, its own
moment of the box's load) with one torch thread, timing a few small ``sdpa`` CPU cases, forward
and backward, through :func:`attnbench.timing.case.time_case` under the options
docs/compare.md prescribes, twice: the backend as it is, and a copy that makes every call 3
times (the edit a gate must catch). Run pair ``i`` is runs ``2i`` and ``2i + 1``; every timing
of the second run is set against the first's with
:func:`attnbench.report.compare.gate.classify` at ``--threshold``:

* unchanged (backend against backend): a SLOW is a false alarm, the worst outcome;
* slowed (backend against its 3x copy): anything but SLOW is a slowdown the gate missed.

``--load N`` starts N processes that multiply matrices (one thread each: caches, memory
bandwidth and the cores taken, as other jobs do) for the whole benchmark, on top of whatever
else the box runs. A run pair fails the gate (``compare`` exits 1) when any of its unchanged
timings is SLOW. The figures printed at the end are the ones docs/compare.md quotes. Timings,
not a test: run it by hand (``--save FILE`` keeps the runs, ``--judge FILE`` judges them again).
"""

from __future__ import annotations

import attnbench.kernels  # noqa: F401  (first: TRITON_INTERPRET=1 on machines without a GPU)

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace

# (seqlen, head_dim) of batch 1, 4 heads, fp32: a ~0.1 ms and a ~0.4 ms forward on one core,
# backwards ~3x that: the sub-millisecond calls that never settled at one call a sample.
SHAPES = ((128, 32), (256, 32))
SLOWDOWN = 3
GATE_OPTIONS = dict(warmup=3, warmup_ms=0, min_samples=20, max_samples=60, max_seconds=0.5,
                    cpu_clock="cpu")
"""docs/compare.md's ``timing:`` options for a gate on a shared CPU box."""


class Slowed:
    """A backend whose every call makes the call ``SLOWDOWN`` times (the edit under test)."""

    def __init__(self, backend):
        self.backend = backend

    def forward(self, q, k, v, spec):
        for _ in range(SLOWDOWN - 1):
            self.backend.forward(q, k, v, spec)
        return self.backend.forward(q, k, v, spec)

    def backward(self, ctx, dout):
        for _ in range(SLOWDOWN - 1):
            self.backend.backward(ctx, dout)
        return self.backend.backward(ctx, dout)


BUSY = ("import numpy as np\n"
        "a = np.random.default_rng(0).random((384, 384))\n"
        "while True:\n    a = a @ a\n    a /= np.abs(a).max()\n")
"""One busy process of ``--load``: matrix products, 1 thread (OMP_NUM_THREADS=1)."""


def busy(n: int) -> list[subprocess.Popen]:
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return [subprocess.Popen([sys.executable, "-c", BUSY], env=env) for _ in range(n)]


def one_run(settings: list[str]) -> dict:
    """Every timing of one run: {setting: {"<shape> <backend> <direction>": stats}}."""
    import torch

    from attnbench.backends import get_backend
    from attnbench.problem.attn_spec import AttnSpec
    from attnbench.problem.inputs import make_inputs
    from attnbench.sweep.case import make_case
    from attnbench.sweep.options import TimingOptions
    from attnbench.timing.case import time_case

    torch.set_num_threads(1)  # what every CPU rank gets (docs/compare.md)
    device = torch.device("cpu")
    options = TimingOptions(**GATE_OPTIONS)
    out: dict = {s: {} for s in settings}
    for seqlen, head_dim in SHAPES:
        case = make_case("gate", dict(backend="sdpa", batch=1, heads_q=4, heads_kv=4,
                                      head_dim=head_dim, seqlen_q=seqlen, dtype="fp32"))
        spec = AttnSpec.from_case(case)
        q, k, v, dout = make_inputs(case, device)
        original = get_backend("sdpa")
        for name, backend in (("same", original), ("slowed", Slowed(original))):
            fwd = backend.forward(q, k, v, spec)
            backend.backward(fwd.ctx, dout)
            for setting in settings:
                # "single": one call a sample, what the CPU loop did before issue 40
                timing = replace(options, cpu_min_sample_ms=0.0) if setting == "single" \
                    else options
                t = time_case(case, device, lambda: backend.forward(q, k, v, spec),
                              lambda: backend.backward(fwd.ctx, dout), timing)
                for d in ("fwd", "bwd"):
                    out[setting][f"{seqlen}x{head_dim} {name} {d}"] = {
                        k: t[d][k] for k in ("median_ms", "min_ms", "q1_ms", "q3_ms", "n",
                                             "noisy", "calls_per_sample")}
    return out


def _side(stats: dict) -> dict:
    return {"median": stats["median_ms"], "min": stats["min_ms"], "q3": stats["q3_ms"],
            "q1": stats["q1_ms"], "n": stats["n"], "noisy": stats["noisy"]}


def judge(runs: list[dict], setting: str, threshold: float) -> dict:
    """Classes of the unchanged and slowed timings of every run pair, and how many pairs fail."""
    from attnbench.report.compare.gate import bound, classify, few_samples

    def margin(a: dict, b: dict) -> float:
        """B's best over the bound it must pass: SLOW above 1."""
        sa, sb = _side(a), _side(b)
        return sb["min"] / (bound(sa, few_samples(sa, sb)) * (1 + threshold))

    classes = {"same": Counter(), "slowed": Counter()}
    failing_pairs, ratios, spreads, samples, blocks = 0, [], [], [], []
    worst_false, tightest_catch = 0.0, math.inf
    for a_run, b_run in zip(runs[0::2], runs[1::2]):
        a_all, b_all = a_run[setting], b_run[setting]
        failed = False
        for key, a in a_all.items():
            shape, name, d = key.split()
            if name != "same":
                continue
            for kind in ("same", "slowed"):
                b = b_all[f"{shape} {kind} {d}"]
                verdict = classify(_side(a), _side(b), threshold)
                classes[kind][verdict] += 1
                if kind == "same":
                    failed |= verdict == "SLOW"
                    ratios.append(b["median_ms"] / a["median_ms"])
                    worst_false = max(worst_false, margin(a, b))
                else:
                    tightest_catch = min(tightest_catch, margin(a, b))
            for stats in (a, b_all[key]):
                spreads.append((stats["q3_ms"] - stats["q1_ms"]) / stats["median_ms"])
                samples.append(stats["n"])
                blocks.append(stats["calls_per_sample"])
        failing_pairs += failed
    return {"classes": classes, "failing_pairs": failing_pairs, "pairs": len(runs) // 2,
            "ratios": ratios, "spreads": spreads, "samples": samples, "blocks": blocks,
            "worst_false": worst_false, "tightest_catch": tightest_catch}


def simulate(pairs: int = 5000, seed: int = 4) -> None:
    """False SLOW and 3x caught, by A's q3 and by the gate's rule (its fence below 8 samples),
    for timings drawn from one noisy distribution: lognormal sigma 0.2, a fifth of the samples
    stretched by 1 + an exponential of mean 1 (a preempted call), ``n`` samples a side."""
    import numpy as np

    from attnbench.report.compare.gate import classify

    rng = np.random.default_rng(seed)

    def draw(n: int, factor: float = 1.0) -> dict:
        x = np.exp(rng.normal(0.0, 0.2, n)) * factor
        stretched = rng.random(n) < 0.2
        x[stretched] *= 1 + rng.exponential(1.0, stretched.sum())
        q1, median, q3 = np.quantile(x, [0.25, 0.5, 0.75])
        return {"median": median, "min": x.min(), "q1": q1, "q3": q3, "n": n, "noisy": True}

    print(f"# {pairs} seeded pairs a row, threshold 25 %")
    print(f"{'n':>3} {'false SLOW, q3':>15} {'gate':>6} {'3x caught, q3':>14} {'gate':>6}")
    for n in (3, 5, 7, 20):
        counts = [0, 0, 0, 0]
        for _ in range(pairs):
            a, same, slowed = draw(n), draw(n), draw(n, 3.0)
            for k, b in ((0, same), (2, slowed)):
                counts[k] += b["min"] > a["q3"] * 1.25
                counts[k + 1] += classify(a, b, 0.25) == "SLOW"
        print(f"{n:>3} {counts[0]:>15} {counts[1]:>6} {counts[2]:>14} {counts[3]:>6}")


def _quantiles(values: list[float]) -> str:
    q = statistics.quantiles(values, n=20, method="inclusive") if len(values) > 1 else values * 19
    return f"{min(values):.3g} / {statistics.median(values):.3g} / {q[18]:.3g} / {max(values):.3g}"


def report(result: dict, setting: str, threshold: float) -> None:
    same, slowed = result["classes"]["same"], result["classes"]["slowed"]
    n_same, n_slowed = sum(same.values()), sum(slowed.values())
    how = "blocks of >= cpu_min_sample_ms" if setting == "blocked" else "one call a sample"
    print(f"\n## {setting} ({how}), threshold {threshold:.0%}")
    print(f"unchanged timings: {n_same}: " + ", ".join(f"{n} {k}" for k, n in same.most_common()))
    print(f"  false SLOW: {same['SLOW']}; run pairs failing the gate: "
          f"{result['failing_pairs']} of {result['pairs']}")
    print(f"  closest to a false SLOW: B.min / (bound(A) x {1 + threshold:g}) = "
          f"{result['worst_false']:.2f} (SLOW above 1)")
    print(f"  median ratio B/A min / median / p95 / max: {_quantiles(result['ratios'])}")
    print(f"3x slowed timings: {n_slowed}: "
          + ", ".join(f"{n} {k}" for k, n in slowed.most_common()))
    print(f"  caught (SLOW): {slowed['SLOW']} of {n_slowed}; the tightest: B.min / (bound(A) x "
          f"{1 + threshold:g}) = {result['tightest_catch']:.2f}")
    print(f"spread (q3-q1)/median min / median / p95 / max: {_quantiles(result['spreads'])}")
    print(f"samples per timing min / median / p95 / max: {_quantiles(result['samples'])}")
    print(f"calls per sample min / median / p95 / max: {_quantiles(result['blocks'])}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=20, help="run pairs (two processes each)")
    p.add_argument("--threshold", type=float, default=0.25)
    p.add_argument("--single", action="store_true",
                   help="also time with one call a sample (cpu_min_sample_ms: 0)")
    p.add_argument("--load", type=int, default=0, help="busy processes beside the runs")
    p.add_argument("--save", help="write the runs' timings to this JSON file")
    p.add_argument("--judge", help="judge the runs of a --save file again, without timing")
    p.add_argument("--simulate", action="store_true",
                   help="only the drawn timings of few samples (no runs, a few seconds)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    settings = ["blocked"] + (["single"] if args.single else [])
    if args.worker:
        print(json.dumps(one_run(settings)))
        return 0
    if args.simulate:
        simulate()
        return 0
    if args.judge:
        saved = json.loads(open(args.judge).read())
        for setting in saved["settings"]:
            report(judge(saved["runs"], setting, args.threshold), setting, args.threshold)
        return 0
    loaders = busy(args.load)
    try:
        return _benchmark(args, settings, len(loaders))
    finally:
        for proc in loaders:  # ours, by their handles
            proc.kill()
            proc.wait()


def _benchmark(args, settings: list[str], load: int) -> int:
    started = time.monotonic()
    time.sleep(1.0 if load else 0.0)  # the busy processes up and running
    print(f"# {args.pairs} run pairs, {len(SHAPES)} shapes x fwd/bwd, sdpa fp32 on the CPU, "
          f"1 thread; {load} busy processes started beside them; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          f"options {GATE_OPTIONS}")
    runs = []
    command = [sys.executable, __file__, "--worker"] + (["--single"] if args.single else [])
    for i in range(2 * args.pairs):
        proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            return 1
        runs.append(json.loads(proc.stdout.splitlines()[-1]))
        print(f"  run {i + 1}/{2 * args.pairs} done, {time.monotonic() - started:.0f} s, "
              f"load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    if args.save:
        with open(args.save, "w") as f:
            json.dump({"settings": settings, "runs": runs}, f)
    for setting in settings:
        report(judge(runs, setting, args.threshold), setting, args.threshold)
    print(f"\n# {time.monotonic() - started:.0f} s; load average at the end "
          f"{os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
