"""What a rank pool costs: cold start, warm round trip, recovery after a crash.

    python benchmarks/pool_overhead.py [--calls 2000] [--starts 5]

Warm round trip = one :meth:`RankPool.run` of a trivial function (``testing:echo`` with a
case-sized payload) on ranks that are already running: pickling, two pipe hops, the poll loop and
the log bookkeeping. The design goal is well under 10 ms per case. Cold start = starting the
ranks and getting their first answer; with ``threads`` set, each rank imports torch first.
"""

from __future__ import annotations

import argparse
import statistics
import time

from attnbench.execution.pool import RankPool

ECHO = "attnbench.execution.testing:echo"
SEGFAULT = "attnbench.execution.testing:segfault"
# About the size of a real payload: a Case dict plus RunOptions.
PAYLOAD = {"case": {f"field_{i}": i for i in range(24)},
           "options": {"timeout_s": 300.0, "accuracy": True,
                       "timing": {"warmup": 2, "min_samples": 5, "max_samples": 100}}}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.3f} ms"


def _summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    text = f"median {_ms(statistics.median(ordered))}"
    if len(ordered) >= 20:
        cuts = statistics.quantiles(ordered, n=100)
        text += f"  p90 {_ms(cuts[89])}  p99 {_ms(cuts[98])}"
    return text + f"  min {_ms(ordered[0])}  max {_ms(ordered[-1])}  (n={len(ordered)})"


def cold_start(starts: int, **pool_args) -> list[float]:
    samples = []
    for _ in range(starts):
        with RankPool(**pool_args) as pool:
            t0 = time.perf_counter()
            outcome = pool.run(ECHO, PAYLOAD, timeout=120)
            samples.append(time.perf_counter() - t0)
            assert outcome.kind == "ok", outcome
    return samples


def warm_calls(calls: int, **pool_args) -> list[float]:
    with RankPool(**pool_args) as pool:
        for _ in range(20):  # first call starts the ranks; the rest warm caches
            pool.run(ECHO, PAYLOAD, timeout=120)
        samples = []
        for _ in range(calls):
            t0 = time.perf_counter()
            outcome = pool.run(ECHO, PAYLOAD, timeout=120)
            samples.append(time.perf_counter() - t0)
        assert outcome.kind == "ok" and pool.starts == 1, outcome
    return samples


def crash_recovery(repeats: int) -> tuple[list[float], list[float]]:
    detect, restart = [], []
    with RankPool() as pool:
        pool.run(ECHO, PAYLOAD, timeout=120)
        for _ in range(repeats):
            crash = pool.run(SEGFAULT, None, timeout=120)
            assert crash.kind == "crash", crash
            detect.append(crash.wall_s)
            again = pool.run(ECHO, PAYLOAD, timeout=120)
            restart.append(again.wall_s)
    return detect, restart


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="warm calls to time")
    parser.add_argument("--starts", type=int, default=5, help="cold starts to time")
    parser.add_argument("--no-torch", action="store_true", help="skip the cold start with torch")
    args = parser.parse_args()

    print("warm round trip, world_size=1      ", _summary(warm_calls(args.calls)))
    print("warm round trip, world_size=2      ",
          _summary(warm_calls(max(args.calls // 4, 10), world_size=2)))
    print("cold start + first call, no torch  ", _summary(cold_start(args.starts)))
    if not args.no_torch:
        print("cold start + first call, threads=1 ",
              _summary(cold_start(max(args.starts // 2, 1), threads=1)), "(imports torch)")
    detect, restart = crash_recovery(max(args.starts // 2, 1))
    print("segfault detected (call wall)      ", _summary(detect))
    print("next call after a crash (restart)  ", _summary(restart))


if __name__ == "__main__":
    main()
