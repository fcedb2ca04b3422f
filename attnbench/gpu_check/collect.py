"""The collection: whatever the steps did, make the folder a complete run directory and say
what came of the check. ``summary.json``; runs in the driver (no torch), always, last.

Every case of both sweeps gets a record: one its step never reached is ``skipped`` with the
reason (its step timed out, failed, or the budget ran out), never silently missing. The
summary holds each step's status and seconds beside the plan's estimate, the verdicts, the
figures, the pre-warm's compile seconds, the timer check's gaps and the clock log's summary.
"""

from __future__ import annotations

import collections
import datetime as _dt
import json
import time
from pathlib import Path
from typing import Any, Optional

from attnbench.gpu_check.folder import CONFIGS, PROBE, SUMMARY, TIMER, folder_files, open_store
from attnbench.gpu_check.plan import Plan
from attnbench.gpu_check.step_main import StepConfig
from attnbench.gpu_check.step_runner import StepResult
from attnbench.gpu_check.sweeps import ROLES, CheckSweeps
from attnbench.gpu_check.timer_check import direction_text
from attnbench.results.files import write_atomic
from attnbench.results.records import BAD_VERDICTS, make_record


def collect_folder(config: StepConfig, sweeps: CheckSweeps, plan: Plan, steps: list[StepResult],
            smi: dict[str, Any], started: str, t0: float) -> dict[str, Any]:
    """Complete the journal, write ``summary.json``; return the summary. ``t0``: the check's
    start, ``time.monotonic()``."""
    began = time.monotonic()
    records = _complete_journal(config, sweeps, {s.name: s for s in steps}, plan)
    folder = config.folder
    step = plan.step("collect")
    steps = [*steps, StepResult("collect", "ok", seconds=round(time.monotonic() - began, 1),
                                estimate_s=step.estimate_s, timeout_s=step.timeout_s)]
    summary = {
        "check": {"mode": plan.mode, "cost_model": plan.machine,
                  "kernel_configs": sweeps.kernel_configs, "budget_s": plan.budget_s,
                  "estimate_s": round(plan.total_s, 1), "started": started,
                  "finished": utc_now(), "wall_s": round(time.monotonic() - t0, 1)},
        "device": _device(_read(folder / PROBE)),
        "steps": [s.to_dict() for s in steps],
        "verdicts": _verdicts(records, sweeps),
        "failing": [{"label": r["label"], "verdict": r["verdict"], "reason": r["reason"][:300]}
                    for r in records if r["verdict"] in BAD_VERDICTS],
        "figures": [_figure(r) for r in records if r.get("timing")],
        "model": _model(records, plan),
        "compile": _compile(_read(folder / CONFIGS), plan),
        "timer": (_read(folder / TIMER) or {}).get("cases", []),
        "timer_complete": (_read(folder / TIMER) or {}).get("complete", True),
        "smi": smi,
    }
    write_atomic(folder / SUMMARY, json.dumps(summary, indent=1, default=str))
    summary["files"] = folder_files(folder)
    write_atomic(folder / SUMMARY, json.dumps(summary, indent=1, default=str))
    return summary


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _complete_journal(config: StepConfig, sweeps: CheckSweeps, steps: dict[str, StepResult],
                      plan: Plan) -> list[dict]:
    store = open_store(config.folder, sweeps)
    try:
        store.set_manifest(gpu_check={**store.manifest.get("gpu_check", {}),
                                      "plan": plan.to_dict()})
        for role in ROLES:
            step = steps.get(role)
            why = ("its step did not run" if step is None else
                   "its step ended without it" if step.status == "ok" else
                   f"its step {step.status}" + (f" ({step.note})" if step.note else ""))
            for case in sweeps.role(role).cases:
                if case.id not in store.done:
                    store.append(make_record(case, verdict="skipped", reason=(
                        f"not run by attnbench gpu-check: the {role} step ended before this "
                        f"case: {why}")[:500]))
        records, _ = store.records()
    finally:
        store.close()
    return records


def _read(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _device(probe: Optional[dict]) -> dict[str, Any]:
    if not probe:
        return {"note": "no probe.json: the probe step did not finish"}
    env = probe.get("env") or {}
    software = env.get("software") or {}
    return {"device": probe.get("device"), "name": env.get("device_name"),
            "kind": env.get("gpu_kind"), "torch": env.get("torch"), "triton": env.get("triton"),
            "cuda": software.get("cuda_runtime"), "cudnn": software.get("cudnn"),
            "driver": software.get("driver_version"),
            "matmul_peak_tflops": probe.get("matmul_peak_tflops"),
            "precision": probe.get("precision"),
            # False: the step was cut (a hang): what is here was measured, the rest is missing.
            "probe_complete": probe.get("complete", True)}


def _verdicts(records: list[dict], sweeps: CheckSweeps) -> dict[str, dict]:
    """role -> backend -> verdict -> count."""
    role_of = {c.id: role for role in ROLES for c in sweeps.role(role).cases}
    table: dict[str, dict] = {role: collections.defaultdict(collections.Counter)
                              for role in ROLES}
    for r in records:
        table[role_of.get(r["id"], "speed")][r["case"]["backend"]][r["verdict"]] += 1
    return {role: {b: dict(c) for b, c in sorted(by.items())} for role, by in table.items()}


def _figure(record: dict) -> dict[str, Any]:
    timing = record["timing"]
    out = {"label": record["label"], "backend": record["case"]["backend"],
           "verdict": record["verdict"]}
    for direction in ("fwd", "bwd"):
        stats = timing.get(direction)
        if stats:
            out[direction] = {k: stats.get(k) for k in ("median_ms", "tflops", "gbps",
                                                        "pct_measured_peak",
                                                        "pct_peak_bandwidth", "noisy")}
            clocks = timing.get(f"clocks_{direction}") or {}
            if clocks.get("throttled"):  # per case: the card was slowed in this window
                out[direction]["throttled"] = clocks.get("reasons") or "violation counters"
    if timing.get("note"):
        out["note"] = timing["note"]
    return out


MODEL_OFF = 2.0
"""A case whose wall time is this far from the cost model's (either way) is listed."""


def _model(records: list[dict], plan: Plan) -> dict[str, Any]:
    """The cost model against the cases' wall times: totals, and the cases it missed by more
    than :data:`MODEL_OFF` x (what to recalibrate first)."""
    pairs = [(r, plan.case_s[r["id"]]) for r in records
             if r["id"] in plan.case_s and r["verdict"] != "skipped"]
    missed = sorted(({"label": r["label"], "wall_s": round(r.get("wall_s") or 0, 2),
                      "estimate_s": est} for r, est in pairs
                     if not est / MODEL_OFF <= (r.get("wall_s") or 0) <= est * MODEL_OFF),
                    key=lambda m: -abs(m["wall_s"] - m["estimate_s"]))
    return {"cases": len(pairs), "wall_s": round(sum(r.get("wall_s") or 0 for r, _ in pairs), 1),
            "estimate_s": round(sum(est for _, est in pairs), 1), "missed": missed[:10]}


def _compile(configs: Optional[dict], plan: Plan) -> dict[str, Any]:
    planned = {"variants": len(plan.variants),
               "kernels": sum(len(v.kernels) for v in plan.variants),
               "compilations": sum(v.compiles for v in plan.variants)}
    if not configs:
        return {"status": "no configs.json: the pre-warm step did not finish", "plan": planned}
    variants = configs.get("variants") or []
    return {"status": configs.get("status"), "note": configs.get("note", ""),
            "seconds": configs.get("seconds"), "compile_seconds": configs.get("compile_seconds"),
            "variants": len(variants), "kernels": configs.get("kernels"), "plan": planned,
            "per_variant": [{"variant": v.get("variant"), "status": v.get("status"),
                             "kernels": v.get("kernels"), "seconds": v.get("seconds")}
                            for v in variants]}


# -- what the driver prints -------------------------------------------------------------------


def _figure_text(fig: dict) -> str:
    """``fwd 1.234 ms 456 TFLOP/s (58% of measured)  bwd ...``; GB/s for forward-only cases."""
    parts = []
    for direction in ("fwd", "bwd"):
        stats = fig.get(direction)
        if not stats:
            continue
        text = f"{direction} {stats['median_ms']:.3f} ms"
        if stats.get("tflops"):
            text += f" {stats['tflops']:.3g} TFLOP/s"
            if stats.get("pct_measured_peak"):
                text += f" ({stats['pct_measured_peak']:.0f}% of measured)"
        if stats.get("gbps") and not fig.get("bwd"):
            text += f" {stats['gbps']:.3g} GB/s"
        parts.append(text + (" noisy" if stats.get("noisy") else "")
                     + (f" throttled ({stats['throttled']})" if stats.get("throttled") else ""))
    return "  ".join(parts)


def summary_lines(summary: dict[str, Any], folder: Path) -> list[str]:
    device = summary["device"]
    lines = [f"gpu-check: {device.get('name') or device.get('note')} ({device.get('kind')}), "
             f"torch {device.get('torch')}, triton {device.get('triton')}, "
             f"kernel configs {summary['check']['kernel_configs']}"
             + ("; the probe was cut: its file holds the parts it finished"
                if device.get("probe_complete") is False else "")]
    lines.append(f"  {'step':<9} {'status':<11} {'seconds':>8} {'estimate':>9}")
    for s in summary["steps"]:
        lines.append(f"  {s['name']:<9} {s['status']:<11} {s['seconds']:>8.1f} "
                     f"{s['estimate_s']:>9.1f}" + (f"  {s['note'][:120]}" if s["note"] else ""))
    check = summary["check"]
    lines.append(f"  {'total':<9} {'':<11} {check['wall_s']:>8.1f} {check['estimate_s']:>9.1f}")
    for role, table in summary["verdicts"].items():
        counts = ", ".join(f"{b}: " + " ".join(f"{n} {v}" for v, n in sorted(c.items()))
                           for b, c in table.items())
        lines.append(f"  {role}: {counts}")
    for bad in summary["failing"][:20]:
        lines.append(f"  {bad['verdict'].upper():<8} {bad['label']}: {bad['reason'][:160]}")
    for fig in summary["figures"][:40]:
        lines.append(f"  {fig['label']}: {_figure_text(fig)}")
    model = summary["model"]
    lines.append(f"  cost model: {model['cases']} cases took {model['wall_s']} s, "
                 f"estimated {model['estimate_s']} s; {len(model['missed'])} off by over "
                 f"{MODEL_OFF:g}x" + "".join(f"\n    {m['label']}: {m['wall_s']} s vs "
                                            f"{m['estimate_s']} s" for m in model["missed"][:5]))
    comp = summary["compile"]
    lines.append(f"  compile: {comp.get('status')}; {comp.get('variants', 0)} variants, "
                 f"{comp.get('kernels')} kernels ({comp['plan']['kernels']} planned), "
                 f"{comp.get('compile_seconds')} s of compiling in {comp.get('seconds')} s"
                 + (f"; {comp['note']}" if comp.get("note") else ""))
    for entry in summary["timer"]:
        gaps = [direction_text(d, entry[d]) for d in ("fwd", "bwd") if entry.get(d)]
        notes = sorted({n for n in (entry.get("notes") or {}).values() if n})
        lines.append(f"  timer: {entry['label']}: eager - graph = {', '.join(gaps) or '-'}"
                     + (f" [{'; '.join(notes)[:200]}]" if notes else ""))
    if summary.get("timer_complete") is False:
        lines.append(f"  timer: the step was cut after {len(summary['timer'])} cases; "
                     f"those are kept")
    smi = summary["smi"]
    lines.append("  clocks: " + (f"{smi.get('samples')} samples; SM clock {smi.get('sm_clock_mhz')}"
                                 f", power {smi.get('power_w')}, throttled samples "
                                 f"{smi.get('throttled_samples')}" if smi.get("file")
                                 else smi.get("note", "no log")))
    lines.append(f"gpu-check: results in {folder}/ ({len(summary['files'])} files); draw the "
                 f"report anywhere: attnbench report {folder}")
    return lines
