"""The comparison dashboard: each run against the baseline, figures and a sortable table.

Environment differences (driver, CUDA, torch, clocks, commit, ...) are warnings at the top of
each pair; a noisy timing (spread never settled) is AMBIGUOUS, badged in the table and drawn
hollow; "timed" cases read "not judged" and are compared for speed only."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Sequence

import matplotlib
import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from attnbench.report.compare.comparison import (NOISY_WHY, Comparison, ambiguous_reasons, describe,
                                      run_facts)
from attnbench.report.read.data import DIRECTIONS
from attnbench.report.page.figures import (DIRECTION_LABELS, TENSOR_LABELS, Context, FigureFile,
                                      new_figure, page_colors, positions, save_figure, setup_x)
from attnbench.report.page.html import (abandon_output_dir, claim_output_dir, class_badge, esc,
                                        filter_controls, finish_output_dir, fmt, noisy_badge,
                                        page, repro_command, sort_key, verdict_badge)
from attnbench.report.page.style import CLASS_COLORS, RC, VERDICT_COLORS, verdict_label
from attnbench.results.files import write_atomic
from attnbench.results.records import TENSORS

MAX_CASES_LISTED = 5_000
"""Rows of one comparison's case tables (matched cases, regressions): ~1 KB of HTML each, so
10^6 matched cases would make a page of a GB; a line counts the rest."""


def build_compare(comps: Sequence[Comparison], out_dir: Path, command: Sequence[str]) -> Path:
    claim = claim_output_dir(out_dir)
    written: list[Path] = []
    try:
        ctx = Context(out_dir=out_dir, colors=page_colors([c.a.frame for c in comps] +
                                                          [c.b.frame for c in comps]))
        sections, nav = [], []
        with matplotlib.rc_context(RC):
            for i, comp in enumerate(comps):
                anchor = f"pair{i + 1}"
                nav.append((anchor, f"{comp.b.run_id} vs {comp.a.run_id}"))
                sections.append(pair_section(i, comp, ctx, anchor, written))
        header = compare_header(comps, command)
        index = out_dir / "index.html"
        write_atomic(index, page("attnbench compare · " + " vs ".join(
            [comps[0].a.run_id] + [c.b.run_id for c in comps]), header, nav,
            "\n".join(sections)))
    except BaseException:
        abandon_output_dir(claim)
        raise
    finish_output_dir(claim, written)
    return index


def compare_header(comps: Sequence[Comparison], command: Sequence[str]) -> str:
    runs = [comps[0].a] + [c.b for c in comps]
    rows = []
    for k, run in enumerate(runs):
        facts = run_facts(run)
        role = "baseline" if k == 0 else f"run {k + 1}"
        text = "; ".join(f"{name} {value}" for name, value in facts.items())
        rows.append(f"<dt>{esc(role)}</dt><dd><code>{esc(run.run_id)}</code> — "
                    f"{esc(run.manifest.get('created', '?'))} — {esc(text)}</dd>")
    total_reg = sum(len(c.regressions) for c in comps)
    status = (f'<span class="badge" style="background:{CLASS_COLORS["SLOW"]};color:#fff">'
              f"{total_reg} regression(s): exit status 1</span>" if total_reg else
              f'<span class="badge" style="background:{CLASS_COLORS["FAST"]};color:#fff">'
              "no regressions</span>")
    return (f'<header class="run"><h1>attnbench compare</h1>'
            f'<div class="sub"><code>{esc(shlex.join(command))}</code></div>'
            f'<dl>{"".join(rows)}</dl><div class="totals">{status}</div></header>')


def pair_section(i: int, c: Comparison, ctx: Context, anchor: str,
                 written: list[Path] | None = None) -> str:
    """One pair's section; the figure files it draws are added to ``written``."""
    p = c.pairs
    parts = [f'<section id="{anchor}"><h2>{esc(c.b.run_id)} against {esc(c.a.run_id)}</h2>',
             f'<p class="desc">A (baseline) = {esc(describe(c.a))}<br>B = {esc(describe(c.b))}'
             + (f"<br>Differs: {esc('; '.join(c.differences))}" if c.differences else "")
             + "</p>"]
    if c.warnings:
        parts.append('<ul class="warn">' + "".join(f"<li>{esc(w)}</li>" for w in c.warnings)
                     + "</ul>")
    n_same = int(p.same_kind.sum()) if len(p) else 0
    parts.append(f"<p>{len(p)} matched case pairs ({n_same} on the same GPU kind, "
                 f"{len(p) - n_same} across GPU kinds: ratios only); {len(c.only_a)} cases only "
                 f"in A, {len(c.only_b)} only in B. Threshold {c.threshold:.0%}: a difference "
                 "counts when the intervals [min, q3] separate by more than it.</p>")
    for d in DIRECTIONS:
        counts = p[f"{d}_class"].value_counts() if len(p) else pd.Series(dtype=int)
        badges = " ".join(class_badge(k, int(counts[k]))
                          for k in ("SLOW", "FAST", "AMBIGUOUS", "SAME", "RATIO", "n/a")
                          if k in counts)
        whys = ambiguous_reasons(p, d)
        why = (" (AMBIGUOUS: " + ", ".join(f"{n} {w}" for w, n in whys.items()) + ")"
               if whys else "")
        parts.append(f"<p><b>{DIRECTION_LABELS[d]}</b>: {badges or 'nothing timed'}{esc(why)}</p>")
    unjudged = int(p.not_judged.sum()) if len(p) else 0
    if unjudged:
        parts.append(f"<p>{unjudged} case pair(s) not compared for accuracy: "
                     f"{esc(verdict_label('timed'))} in A or B (timed only, accuracy: false); "
                     "their speed is compared.</p>")
    figs: list[FigureFile] = []
    if len(p) and any(p[f"{d}_speed"].notna().any() for d in DIRECTIONS):
        figs.append(speed_figure(i, c, ctx))
    if len(p) and p.worst_err_ratio.notna().any():
        figs.append(error_figure(i, c, ctx))
    if written is not None:
        written.extend(p for f in figs for p in (f.png, f.svg))
    if figs:
        parts.append('<div class="figs">')
        for f in figs:
            parts.append(f'<figure><a href="{esc(f.svg.name)}"><img src="{esc(f.png.name)}" '
                         f'width="{f.width_px}" height="{f.height_px}" alt="{esc(f.caption)}"></a>'
                         f'<figcaption>{esc(f.caption)} <a href="{esc(f.png.name)}">PNG</a> · '
                         f'<a href="{esc(f.svg.name)}">SVG</a></figcaption></figure>')
        parts.append("</div>")
    parts.append(regressions_html(c))
    parts.append(pairs_table(i, c))
    parts.append(unmatched_html(c))
    parts.append("</section>")
    return "\n".join(parts)


def speed_figure(i: int, c: Comparison, ctx: Context) -> FigureFile:
    p = c.pairs
    backends = sorted(set(p.backend_b.astype(str)))
    fig = new_figure(3.9 * len(DIRECTIONS) + 0.6, 0.6 + 2.3 * len(backends))
    axes = fig.subplots(len(backends), len(DIRECTIONS), squeeze=False, sharey=True)
    present: set[str] = set()
    has_same = bool(p.same_kind.any())
    any_noisy = False
    for row, backend in enumerate(backends):
        sub = p[p.backend_b.astype(str) == backend]
        for col, d in enumerate(DIRECTIONS):
            ax = axes[row][col]
            last_row = row == len(backends) - 1
            pos = setup_x(ax, sub.seqlen_q_b.tolist(), "seqlen_q" if last_row else "")
            ax.set_yscale("log", base=2)
            ax.axhline(1.0, color="#444444", lw=1)
            if has_same:
                ax.axhspan(1 / (1 + c.threshold), 1 + c.threshold, color="#dddddd", alpha=0.5,
                           lw=0)
            s = sub[sub[f"{d}_speed"].notna()]
            # spread points at one seqlen sideways, in a fixed order, so they do not overlap
            offsets = s.groupby("seqlen_q_b").cumcount().to_numpy()
            widths = s.groupby("seqlen_q_b")["seqlen_q_b"].transform("size").to_numpy()
            for cls in ("SAME", "AMBIGUOUS", "RATIO", "FAST", "SLOW"):
                mask = (s[f"{d}_class"] == cls).to_numpy()
                if not mask.any():
                    continue
                present.add(cls)
                xs = positions(pos, s.seqlen_q_b[mask])
                spread = (offsets[mask] - (widths[mask] - 1) / 2) / np.maximum(widths[mask], 1)
                xs = xs * 2 ** (0.3 * spread)
                y = s[f"{d}_speed"][mask].to_numpy()
                yerr = np.vstack([y - s[f"{d}_speed_lo"][mask].to_numpy(),
                                  s[f"{d}_speed_hi"][mask].to_numpy() - y])
                hollow = (s[f"{d}_noisy"][mask] != "").to_numpy()  # spread never settled
                for part, face in ((~hollow, CLASS_COLORS[cls]), (hollow, "white")):
                    if part.any():
                        ax.errorbar(xs[part], y[part], yerr=np.clip(yerr[:, part], 0, None),
                                    fmt="o", ms=3.2, color=CLASS_COLORS[cls], mfc=face,
                                    elinewidth=0.8, alpha=0.85, zorder=3)
                any_noisy |= bool(hollow.any())
            if len(s):
                med = s.groupby("seqlen_q_b")[f"{d}_speed"].median()
                ax.plot([pos(v) for v in med.index], med.values, color="#1d2330", lw=1.2,
                        marker="_", ms=12, zorder=4)
            if row == 0:
                ax.set_title(DIRECTION_LABELS[d])
            if col == 0:
                ax.set_ylabel(f"{backend}\nspeed B / A")
    _ratio_ticks(axes[0][0])
    order = [k for k in ("SLOW", "FAST", "AMBIGUOUS", "SAME", "RATIO") if k in present]
    handles = [Line2D([], [], marker="o", ls="", color=CLASS_COLORS[k]) for k in order]
    labels = list(order)
    if any_noisy:
        handles.append(Line2D([], [], marker="o", ls="", color="#444444", mfc="white"))
        labels.append("hollow: noisy")
    handles.append(Line2D([], [], color="#1d2330", lw=1.2, marker="_", ms=12))
    labels.append("median per seqlen")
    if has_same:
        handles.append(Patch(color="#dddddd"))
        labels.append(f"±{c.threshold:.0%}")
    fig.legend(handles, labels, loc="outside lower center", ncols=len(handles), frameon=False)
    fig.suptitle(f"Speed of {c.b.run_id} relative to {c.a.run_id} (above 1: B faster)",
                 fontsize=10, fontweight="bold")
    return save_figure(fig, ctx, f"c{i + 1:02d}-speed",
                       "Each point is a case: median speed ratio, bars from the robust interval "
                       "[min, q3]; colour is the class; hollow: a side's timing is noisy (its "
                       "spread never settled), so the case is AMBIGUOUS.")


RATIO_TICKS = (1 / 8, 1 / 4, 1 / 3, 1 / 2, 2 / 3, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 4.0, 8.0)
FINE_TICKS = (0.8, 0.9, 1.1, 1.25)


def _ratio_ticks(ax) -> None:
    """Readable ratio ticks (0.5x, 0.8x, 1x, 1.25x, 2x) on a shared log axis."""
    lo, hi = ax.get_ylim()
    ticks = [t for t in RATIO_TICKS if lo <= t <= hi]
    if len(ticks) > 7:
        ticks = [t for t in ticks if t not in FINE_TICKS]
    ax.yaxis.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
    ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:.2g}x"))


def error_figure(i: int, c: Comparison, ctx: Context) -> FigureFile:
    p = c.pairs
    fig = new_figure(2.9 * len(TENSORS) + 0.4, 3.4)
    axes = fig.subplots(1, len(TENSORS), squeeze=False, sharey=True)[0]
    handles: dict[str, object] = {}
    for ax, t in zip(axes, TENSORS):
        col = f"{t}_err_ratio"
        s = p[p[col].notna() & (p[col] > 0)]
        pos = setup_x(ax, s.seqlen_q_b.tolist() or [1], "seqlen_q")
        ax.set_yscale("log")
        ax.axhline(1.0, color="#444444", lw=1)
        ax.set_title(TENSOR_LABELS[t])
        for backend, sb in s.groupby(s.backend_b.astype(str)):
            color = ctx.color(backend)
            h = ax.scatter(positions(pos, sb.seqlen_q_b), sb[col], s=12, color=color, alpha=0.6,
                           lw=0)
            handles.setdefault(backend, h)
        bad = s[s.verdict_changed]
        if len(bad):
            h = ax.scatter(positions(pos, bad.seqlen_q_b), bad[col], s=50, facecolors="none",
                           edgecolors=VERDICT_COLORS["fail"], lw=1.2)
            handles.setdefault("verdict changed", h)
    axes[0].set_ylabel("rel. L2 error B / A")
    lo, hi = axes[0].get_ylim()
    axes[0].set_ylim(min(lo, 0.5), max(hi, 2.0))
    axes[0].yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axes[0].yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    axes[0].yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    fig.legend(list(handles.values()), list(handles), loc="outside lower center",
               ncols=min(6, len(handles)), frameon=False)
    fig.suptitle(f"Error of {c.b.run_id} relative to {c.a.run_id} (above 1: B less accurate)",
                 fontsize=10, fontweight="bold")
    return save_figure(fig, ctx, f"c{i + 1:02d}-error",
                       "Each point is a case and tensor; red rings: the case's verdict changed.")


def regressions_html(c: Comparison) -> str:
    reg = c.regressions
    if reg.empty:
        return "<h3>Regressions</h3><p>None on the same GPU kind.</p>"
    rows = []
    for r in reg.head(MAX_CASES_LISTED).itertuples():
        what = [f"{d} {class_badge('SLOW')} "
                f"{fmt(100 * (1 / getattr(r, f'{d}_speed') - 1), 3)}% time"
                for d in DIRECTIONS if getattr(r, f"{d}_class") == "SLOW"]
        if r.verdict_regression:
            what.append(f"{verdict_badge(r.verdict_a)} → {verdict_badge(r.verdict_b)}")
        rows.append(f"<tr><td>{'<br>'.join(what)}</td><td>{esc(r.label_b)}<br>"
                    f"<code>{esc(r.id_b)}</code></td><td>{esc(r.reason_b)}</td>"
                    f'<td><code class="cmd">{esc(repro_command(c.b.sweep_path, r.id_b))}</code>'
                    "</td></tr>")
    return ('<h3>Regressions</h3><table class="records"><thead><tr><th>what</th><th>case</th>'
            f"<th>reason (B)</th><th>reproduce (B)</th></tr></thead><tbody>{''.join(rows)}"
            f"</tbody></table>{_more(len(reg), 'regressions')}")


def pairs_table(i: int, c: Comparison) -> str:
    p = c.pairs
    table_id = f"pairs{i + 1}"
    if p.empty:
        return "<h3>Matched cases</h3><p>No case of B matches a case of A.</p>"
    filters = [("fwd_class", "fwd", sorted(set(p.fwd_class))),
               ("bwd_class", "bwd", sorted(set(p.bwd_class))),
               ("verdict_change", "verdict", sorted(set(p.verdict_change))),
               ("backend", "backend", sorted(set(p.backend_b.astype(str)))),
               ("features", "features", sorted(set(p.features_b.astype(str))))]
    head = ("<tr><th>fwd</th><th>bwd</th><th>verdict A → B</th><th>backend</th><th>features</th>"
            "<th>dtype</th><th>seqlen</th><th>GPU A → B</th><th>fwd ms A</th><th>fwd ms B</th>"
            "<th>fwd speed B/A</th><th>bwd ms A</th><th>bwd ms B</th><th>bwd speed B/A</th>"
            "<th>worst err ratio</th><th>case</th></tr>")
    rows = []
    for r in c.named(p.head(MAX_CASES_LISTED)).itertuples():
        verdict = (verdict_badge(r.verdict_a) if r.verdict_a == r.verdict_b else
                   f"{verdict_badge(r.verdict_a)} → {verdict_badge(r.verdict_b)}")
        cells = [_class_cell(r.fwd_class, r.fwd_noisy), _class_cell(r.bwd_class, r.bwd_noisy),
                 f'<td data-sort="{esc(r.verdict_change)}">{verdict}</td>',
                 f"<td>{esc(r.backend_b)}</td><td>{esc(r.features_b)}</td>"
                 f"<td>{esc(r.dtype_b)}</td>",
                 f'<td class="num" data-sort="{sort_key(r.seqlen_q_b)}">{esc(r.seqlen_q_b)}</td>',
                 _gpu_cell(r)]
        for d in DIRECTIONS:
            for v in (getattr(r, f"{d}_median_ms_a"), getattr(r, f"{d}_median_ms_b"),
                      getattr(r, f"{d}_speed")):
                cells.append(f'<td class="num" data-sort="{sort_key(v)}">{esc(fmt(v))}</td>')
        w = r.worst_err_ratio
        cls = " over" if isinstance(w, float) and w > 2 else ""
        cells.append(f'<td class="num{cls}" data-sort="{sort_key(w)}">{esc(fmt(w))}</td>')
        cells.append(f"<td>{esc(r.label_b)}<br><code>{esc(r.id_b)}</code></td>")
        attrs = (f'data-fwd_class="{esc(r.fwd_class)}" data-bwd_class="{esc(r.bwd_class)}" '
                 f'data-verdict_change="{esc(r.verdict_change)}" data-backend="{esc(r.backend_b)}" '
                 f'data-features="{esc(r.features_b)}"')
        rows.append(f"<tr {attrs}>{''.join(cells)}</tr>")
    return (f"<h3>Matched cases</h3>{filter_controls(table_id, filters)}"
            f'<table class="records sortable" id="{table_id}"><thead>{head}</thead>'
            f"<tbody>{''.join(rows)}</tbody></table>{_more(len(p), 'matched cases')}")


def _more(n: int, what: str) -> str:
    """The line under a table cut at MAX_CASES_LISTED rows ("" when nothing was cut)."""
    if n <= MAX_CASES_LISTED:
        return ""
    return (f'<p class="note">{n - MAX_CASES_LISTED} more {what}, not listed (at most '
            f"{MAX_CASES_LISTED}): <code>attnbench compare --format json</code> lists them "
            "all.</p>")


def _class_cell(cls: str, noisy: str) -> str:
    badge = class_badge(cls) + (" " + noisy_badge(f"{noisy}: {NOISY_WHY}") if noisy else "")
    return f'<td data-sort="{esc(cls)}">{badge}</td>'


def _gpu_cell(r) -> str:
    """The exact kinds, A → B when they differ, with the family when the records name one."""
    families = {f for f in (r.gpu_family_a, r.gpu_family_b) if isinstance(f, str) and f}
    family = f'<br><span class="muted">family {esc(", ".join(sorted(families)))}</span>' \
        if families else ""
    kinds = esc(r.run_gpu_a) if r.run_gpu_a == r.run_gpu_b else \
        f"{esc(r.run_gpu_a)} → {esc(r.run_gpu_b)}"
    return f"<td>{kinds}{family}</td>"


def unmatched_html(c: Comparison) -> str:
    parts = []
    for name, df in (("only in A", c.only_a), ("only in B", c.only_b)):
        if df.empty:
            continue
        items = "".join(f"<li>{verdict_badge(r.verdict)} {esc(r.label)} "
                        f"<code>{esc(r.id)}</code></li>" for r in df.head(500).itertuples())
        parts.append(f"<details><summary>{len(df)} cases {name}</summary><ul>{items}</ul>"
                     "</details>")
    return "".join(parts)
