"""Each tensor's error over the fused baseline's (``fused_ratio``, geometric mean over seeds) per
backend, dtype, heads, mask and key length, from a run directory: the table behind the level
findings of docs/findings.md. Pure data: no torch.

    attnbench run benchmarks/sdpa_cpu_precision.yaml --out runs/sdpa-cpu
    python benchmarks/fused_ratios.py runs/sdpa-cpu
"""

from __future__ import annotations

import collections
import math
import sys
from pathlib import Path

from attnbench.results.records import TENSORS
from attnbench.results.store import stream_records


def _lengths(case: dict) -> str:
    """The keys, or queries/keys where they differ."""
    sq, sk = case["seqlen_q"], case.get("seqlen_kv") or case["seqlen_q"]
    return str(sk) if sq == sk else f"{sq}/{sk}"


def table(run_dir: Path) -> list[str]:
    logs: dict[tuple, dict[str, list[float]]] = collections.defaultdict(
        lambda: collections.defaultdict(list))
    for r in stream_records(run_dir):
        c, rows = r["case"], ((r.get("accuracy") or {}).get("tensors") or {})
        key = (c["backend"], c["dtype"], f"h{c['heads_q']}/{c['heads_kv']}", str(c.get("mask")),
               _lengths(c))
        for t in TENSORS:
            ratio = (rows.get(t) or {}).get("fused_ratio")
            if ratio:
                logs[key][t].append(math.log(ratio))
    lines = [f"{'backend':<18}{'dtype':<6}{'heads':<7}{'mask':<8}{'keys':>8}  "
             + "".join(f"{t:>7}" for t in TENSORS)]
    for key in sorted(logs, key=lambda k: (*k[:4], [int(x) for x in k[4].split('/')])):
        cells = "".join(f"{math.exp(sum(v) / len(v)):>7.2f}" if (v := logs[key].get(t)) else
                        f"{'-':>7}" for t in TENSORS)
        b, d, h, m, n = key
        lines.append(f"{b:<18}{d:<6}{h:<7}{m:<8}{n:>8}  {cells}")
    return lines


if __name__ == "__main__":
    print("\n".join(table(Path(sys.argv[1]))))
