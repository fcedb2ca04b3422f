"""Compare runs: the same cases side by side, what got faster, slower, or changed its verdict.

Cases are matched on their case dict minus ``gpu`` (so a sweep run on an H100 and on an A100
matches case for case), and within a match on the GPU kind that actually ran it
(``record.env.gpu_kind``) when both runs have it.

Timing, per direction (fwd, bwd), compares robust intervals: the median with ``[min, q3]``.
With A the baseline, B the other run and ``t`` the threshold (default 5%)::

    SLOW       B.min > A.q3 * (1 + t)     B's best sample is slower than most of A's
    FAST       A.min > B.q3 * (1 + t)
    SAME       otherwise, when the medians are within t of each other
    AMBIGUOUS  otherwise (the intervals overlap, the medians do not agree)

Across different GPU kinds there is no verdict, only the ratio (class ``RATIO``). A regression,
which makes ``attnbench compare`` exit with status 1, is on the same GPU kind: a SLOW case, or a
case that passed in A and has a failing verdict in B (fail, error, crash, timeout, oom, lost).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence, TextIO

import numpy as np
import pandas as pd

from attnbench.records import BAD_VERDICTS, TENSORS
from attnbench.report.data import DIRECTIONS, ReportError, Run, case_key, load_run

CLASSES = ("SLOW", "FAST", "AMBIGUOUS", "SAME", "RATIO", "n/a")
REGRESSION_EXIT = 1
MAX_LISTED = 25  # regressions printed to stdout; the dashboard lists all


def classify(a: dict[str, float], b: dict[str, float], threshold: float) -> str:
    """FAST / SLOW / SAME / AMBIGUOUS for B against A; ``a`` and ``b`` hold median, min, q3."""
    vals = [a.get(k) for k in ("median", "min", "q3")] + [b.get(k) for k in ("median", "min", "q3")]
    if any(v is None or not math.isfinite(v) or v <= 0 for v in vals):
        return "n/a"
    if b["min"] > a["q3"] * (1 + threshold):
        return "SLOW"
    if a["min"] > b["q3"] * (1 + threshold):
        return "FAST"
    if abs(b["median"] / a["median"] - 1) <= threshold:
        return "SAME"
    return "AMBIGUOUS"


@dataclass
class Comparison:
    """Run B against baseline run A; ``pairs`` has one row per matched (case, GPU kind pair)."""

    a: Run
    b: Run
    threshold: float
    pairs: pd.DataFrame
    only_a: pd.DataFrame
    only_b: pd.DataFrame
    differences: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> pd.DataFrame:
        p = self.pairs
        if p.empty:
            return p
        slow = p.same_kind & ((p.fwd_class == "SLOW") | (p.bwd_class == "SLOW"))
        reg = p[slow | p.verdict_regression]
        # verdict regressions first, then the largest slowdown
        worst_speed = reg[[f"{d}_speed" for d in DIRECTIONS]].min(axis=1).fillna(1.0)
        return reg.assign(_o=~reg.verdict_regression, _s=worst_speed).sort_values(
            ["_o", "_s"]).drop(columns=["_o", "_s"])


def _keyed(run: Run) -> pd.DataFrame:
    by_id = {r.get("id"): r for r in run.records}
    df = run.frame.copy()
    df["match_key"] = [case_key(by_id.get(i, {}).get("case") or {}) for i in df.id]
    # A case that died before it reached a device may have no env.gpu_kind: in a run on one
    # GPU kind it ran on that kind; otherwise "?" matches any kind (see compare_runs).
    kinds = run.gpu_kinds
    df["run_gpu"] = df.gpu_kind.fillna(kinds[0] if len(kinds) == 1 else "?").astype(str)
    return df.drop_duplicates(["match_key", "run_gpu"], keep="last")


def compare_runs(a: Run, b: Run, threshold: float = 0.05) -> Comparison:
    fa, fb = _keyed(a), _keyed(b)
    m = fa.merge(fb, on="match_key", suffixes=("_a", "_b"))
    unknown = (m.run_gpu_a == "?") | (m.run_gpu_b == "?")
    same = m[(m.run_gpu_a == m.run_gpu_b) | unknown]
    paired = set(zip(same.match_key, same.run_gpu_a))
    # A record with no twin on its own GPU kind is set against the other run's records of the
    # same case on other kinds: a ratio, never a verdict.
    lone_a = [(k, g) not in paired for k, g in zip(m.match_key, m.run_gpu_a)]
    lone_b = [(k, g) not in paired for k, g in zip(m.match_key, m.run_gpu_b)]
    cross = m[(m.run_gpu_a != m.run_gpu_b) & ~unknown & (pd.Series(lone_a, index=m.index)
                                                         | pd.Series(lone_b, index=m.index))]
    pairs = pd.concat([same, cross], ignore_index=True)
    pairs["same_kind"] = ((pairs.run_gpu_a == pairs.run_gpu_b) | (pairs.run_gpu_a == "?")
                          | (pairs.run_gpu_b == "?"))
    for d in DIRECTIONS:
        classes, ratios, lo, hi = [], [], [], []
        for r in pairs.itertuples():
            sa = {"median": getattr(r, f"{d}_median_ms_a"), "min": getattr(r, f"{d}_min_ms_a"),
                  "q3": getattr(r, f"{d}_q3_ms_a")}
            sb = {"median": getattr(r, f"{d}_median_ms_b"), "min": getattr(r, f"{d}_min_ms_b"),
                  "q3": getattr(r, f"{d}_q3_ms_b")}
            cls = classify(sa, sb, threshold)
            if cls != "n/a" and not r.same_kind:
                cls = "RATIO"
            classes.append(cls)
            ok = cls != "n/a"
            # speed of B relative to A (> 1: B is faster), and its robust range
            ratios.append(sa["median"] / sb["median"] if ok else math.nan)
            lo.append(sa["min"] / sb["q3"] if ok else math.nan)
            hi.append(sa["q3"] / sb["min"] if ok else math.nan)
        pairs[f"{d}_class"] = classes
        pairs[f"{d}_speed"] = ratios
        pairs[f"{d}_speed_lo"] = lo
        pairs[f"{d}_speed_hi"] = hi
    for t in TENSORS:
        ea, eb = pairs[f"{t}_rel_l2_a"], pairs[f"{t}_rel_l2_b"]
        pairs[f"{t}_err_ratio"] = np.where((ea > 0) & (eb >= 0), eb / ea.where(ea > 0), np.nan)
    ratio_cols = [f"{t}_err_ratio" for t in TENSORS]
    pairs["worst_err_ratio"] = pairs[ratio_cols].max(axis=1, skipna=True) if len(pairs) else []
    pairs["verdict_changed"] = pairs.verdict_a != pairs.verdict_b
    pairs["verdict_regression"] = (pairs.same_kind & (pairs.verdict_a == "pass")
                                   & pairs.verdict_b.isin(BAD_VERDICTS))
    pairs["verdict_change"] = [f"{va} → {vb}" if va != vb else va
                               for va, vb in zip(pairs.verdict_a, pairs.verdict_b)]
    only_a = fa[~fa.match_key.isin(set(fb.match_key))]
    only_b = fb[~fb.match_key.isin(set(fa.match_key))]
    return Comparison(a=a, b=b, threshold=threshold, pairs=pairs, only_a=only_a, only_b=only_b,
                      differences=differences(a, b))


def run_facts(run: Run) -> dict[str, str]:
    """What a run is, for telling runs apart: GPU kinds, attnbench and library versions."""
    m = run.manifest
    facts = {"GPU": ", ".join(run.gpu_kinds) or "?"}
    if m.get("attnbench"):
        facts["attnbench"] = str(m["attnbench"])
    for k, v in (m.get("versions") or {}).items():
        facts[k] = str(v)
    env_cols = {"env_attnbench": "attnbench", "env_torch": "torch", "env_triton": "triton"}
    for col, name in env_cols.items():
        vals = sorted(set(run.frame[col].dropna().astype(str))) if col in run.frame else []
        if vals and name not in facts:
            facts[name] = ", ".join(vals)
    facts["sweep"] = str((m.get("sweep") or {}).get("name", "?"))
    return facts


def differences(a: Run, b: Run) -> list[str]:
    fa, fb = run_facts(a), run_facts(b)
    out = []
    for k in dict.fromkeys([*fa, *fb]):
        if fa.get(k) != fb.get(k):
            out.append(f"{k} {fa.get(k, '?')} → {fb.get(k, '?')}")
    return out


def describe(run: Run) -> str:
    f = run_facts(run)
    return (f"{run.run_id} ({f['GPU']}; torch {f.get('torch', '?')}; "
            f"attnbench {f.get('attnbench', '?')})")


# ------------------------------------------------------------------------------------------
# text summary


def _pct(speed: float) -> str:
    if not math.isfinite(speed) or speed <= 0:
        return "?"
    return f"{(1 / speed - 1) * 100:+.1f}% time"


def summary_text(comps: Sequence[Comparison], index: Path | None = None) -> str:
    lines: list[str] = []
    for c in comps:
        p = c.pairs
        lines.append(f"A (baseline) = {describe(c.a)}")
        lines.append(f"B            = {describe(c.b)}")
        if c.differences:
            lines.append("  differs: " + "; ".join(c.differences))
        n_same = int(p.same_kind.sum()) if len(p) else 0
        lines.append(f"  matched {len(p)} case pairs ({n_same} on the same GPU kind, "
                     f"{len(p) - n_same} across GPU kinds); {len(c.only_a)} only in A, "
                     f"{len(c.only_b)} only in B")
        for d in DIRECTIONS:
            counts = p[f"{d}_class"].value_counts() if len(p) else pd.Series(dtype=int)
            text = ", ".join(f"{int(counts[k])} {k}" for k in ("FAST", "SLOW", "SAME", "AMBIGUOUS",
                                                              "RATIO", "n/a") if k in counts)
            lines.append(f"  timing {d} (threshold {c.threshold:.0%}): {text or 'nothing timed'}")
            cross = p[~p.same_kind & p[f"{d}_speed"].notna()] if len(p) else p
            for (ka, kb), s in (cross.groupby(["run_gpu_a", "run_gpu_b"]) if len(cross) else []):
                lines.append(f"    {kb} / {ka} speed ratio: median {s[f'{d}_speed'].median():.2f}x "
                             f"over {len(s)} cases (ratio only: different GPU kinds)")
        changed = p[p.verdict_changed] if len(p) else p
        lines.append(f"  verdicts: {len(changed)} changed" + (
            " (" + ", ".join(f"{n} {k}" for k, n in changed.verdict_change.value_counts().items())
            + ")" if len(changed) else ""))
        if len(p) and p.worst_err_ratio.notna().any():
            worst = p.loc[p.worst_err_ratio.idxmax()]
            lines.append(f"  accuracy: error ratio B/A median {p.worst_err_ratio.median():.2f}, "
                         f"worst {worst.worst_err_ratio:.3g}x ({worst.label_b})")
        reg = c.regressions
        if len(reg):
            lines.append(f"  REGRESSIONS ({len(reg)}):")
            for backend, s in reg.groupby("backend_b"):
                n_slow = int(((s.fwd_class == "SLOW") | (s.bwd_class == "SLOW")).sum())
                n_verdict = int(s.verdict_regression.sum())
                speed = s[[f"{d}_speed" for d in DIRECTIONS]].min(axis=1)
                lines.append(f"    {backend}: {n_slow} slower (median {_pct(speed.median())}), "
                             f"{n_verdict} from pass to a failing verdict")
            for r in reg.head(MAX_LISTED).itertuples():
                what = []
                for d in DIRECTIONS:
                    if getattr(r, f"{d}_class") == "SLOW":
                        what.append(f"SLOW {d} {_pct(getattr(r, f'{d}_speed'))}")
                if r.verdict_regression:
                    what.append(f"{r.verdict_a} -> {r.verdict_b}")
                lines.append(f"    {', '.join(what):<34} {r.label_b} [{r.id_b}]")
            if len(reg) > MAX_LISTED:
                lines.append(f"    ... and {len(reg) - MAX_LISTED} more (the dashboard lists all)")
        else:
            lines.append("  no regressions")
        lines.append("")
    if index is not None:
        lines.append(f"dashboard: {index}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# entry


def run_compare(run_dirs: Sequence[Path], *, threshold: float = 0.05, out_dir: Path | None = None,
                dashboard: bool = True, stream: TextIO = sys.stdout) -> int:
    paths = [Path(d).resolve() for d in run_dirs]
    if len(set(paths)) < len(paths):
        dup = next(p for p in paths if paths.count(p) > 1)
        raise ReportError(f"RUN: {dup} is given twice")
    runs = [load_run(Path(d)) for d in run_dirs]
    ids = [r.run_id for r in runs]
    for run in runs:
        if ids.count(run.run_id) > 1:  # copies of one run directory: tell them apart by path
            run.manifest = {**run.manifest, "run_id": f"{run.run_id} ({run.path})"}
    ids = [r.run_id for r in runs]
    comps = [compare_runs(runs[0], other, threshold) for other in runs[1:]]
    index = None
    if dashboard:
        from attnbench.report.commands import _safe_name, project_root
        from attnbench.report.compare_page import build_compare

        name = "compare-" + "-vs-".join(_safe_name(i) for i in ids)
        out = Path(out_dir) if out_dir else project_root() / "dashboards" / name[:200]
        index = build_compare(comps, out, command=["attnbench", "compare", *map(str, run_dirs),
                                                   "--threshold", str(threshold)])
    stream.write(summary_text(comps, index) + "\n")
    return REGRESSION_EXIT if any(len(c.regressions) for c in comps) else 0
