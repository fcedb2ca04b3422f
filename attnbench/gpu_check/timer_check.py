"""The timer check: the same calls timed eagerly and replayed from a CUDA graph, by the one
timing loop (:mod:`attnbench.timing.loop`, ``mode: eager`` / ``graph``). ``timer.json``.

Inside the loop's window each call is timed between two events with nothing else enqueued, so
eager time minus graph time is what the host adds inside the window: launch gaps (Python,
argument checks, several launches per call) that a short kernel cannot hide. Where it is a
large share of a call, the speed sweep's eager figures for calls that short measure the host,
not the kernel. The cases are the speed sweep's shortest calls
(:meth:`CheckSweeps.timer_cases`), run without accuracy; on a CPU the graph falls back to eager
(the record's timing note says so) and the difference is noise.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional

from attnbench.gpu_check.folder import TIMER
from attnbench.gpu_check.run_cases import MIN_CASE_S, make_pool, run_case
from attnbench.gpu_check.step_main import StepConfig
from attnbench.gpu_check.sweeps import load_check_sweeps
from attnbench.results.files import write_atomic

MODES = ("eager", "graph")


def run_timer(config: StepConfig) -> None:
    sweeps = load_check_sweeps(config.cpu, config.kernel_configs, config.sweeps_dir)
    base = dataclasses.replace(sweeps.options("speed"), accuracy=False)
    options = {mode: dataclasses.replace(base, timing=dataclasses.replace(base.timing, mode=mode))
               for mode in MODES}
    entries = []
    with make_pool(config, sweeps) as pool:
        for case in sweeps.timer_cases():
            records = {}
            for mode in MODES:
                left = config.left_s()
                if left < MIN_CASE_S:
                    break
                records[mode] = run_case(pool, case, options[mode],
                                         min(options[mode].timeout_s, left))
            entry = compare(case.id, case.label, records)
            entries.append(entry)
            # Written after every case: a step killed in a hang still leaves what it measured.
            write_atomic(config.folder / TIMER,
                         json.dumps({"cases": entries, "complete": False}, indent=1))
            print(f"timer: {case.label}: {describe(entry)}", flush=True)
    write_atomic(config.folder / TIMER, json.dumps({"cases": entries, "complete": True}, indent=1))


def compare(case_id: str, label: str, records: dict[str, dict]) -> dict[str, Any]:
    """Per direction: each mode's median per call, the gap (eager - graph) in microseconds and
    as a share of the eager time; each mode's verdict and timing note."""
    entry: dict[str, Any] = {"id": case_id, "label": label,
                             "verdicts": {m: r["verdict"] for m, r in records.items()},
                             "notes": {m: (r.get("timing") or {}).get("note", "") if
                                       r["verdict"] == "timed" else r.get("reason", "")
                                       for m, r in records.items()}}
    for direction in ("fwd", "bwd"):
        medians = {m: _median(records.get(m), direction) for m in MODES}
        if None in medians.values():
            continue
        if _timed_as(records.get("graph"), direction) == "eager":
            # The capture failed (an autograd backward often cannot be captured): both times are
            # eager, and their difference is noise, not the host's share.
            entry[direction] = {"eager_ms": medians["eager"], "graph_ms": None, "gap_us": None,
                                "gap_pct": None, "fell_back": True}
            continue
        gap_ms = medians["eager"] - medians["graph"]
        entry[direction] = {"eager_ms": medians["eager"], "graph_ms": medians["graph"],
                            "gap_us": round(gap_ms * 1e3, 3),
                            "gap_pct": round(100 * gap_ms / medians["eager"], 2)
                            if medians["eager"] else None}
    return entry


def _timed_as(record: Optional[dict], direction: str) -> Optional[str]:
    stats = ((record or {}).get("timing") or {}).get(direction)
    return stats.get("timed_as") if stats else None


def direction_text(direction: str, figures: dict) -> str:
    """One direction's gap, or that the graph fell back to eager (no gap to tell)."""
    if figures.get("fell_back"):
        return f"{direction} not captured, timed eagerly (no gap measured)"
    return f"{direction} {figures['gap_us']:.1f} us ({figures['gap_pct']}%)"


def _median(record: Optional[dict], direction: str) -> Optional[float]:
    stats = ((record or {}).get("timing") or {}).get(direction)
    return stats["median_ms"] if stats else None


def describe(entry: dict) -> str:
    parts = [direction_text(d, e) if e.get("fell_back") else
             f"{d} eager {e['eager_ms']:.4f} ms, graph {e['graph_ms']:.4f} ms, gap "
             f"{e['gap_us']:.1f} us ({e['gap_pct']}%)" for d in ("fwd", "bwd")
             if (e := entry.get(d))]
    notes = sorted({n for n in entry["notes"].values() if n})
    return "; ".join(parts or [f"not timed ({entry['verdicts']})"]) + (
        f" [{'; '.join(notes)}]" if notes else "")
