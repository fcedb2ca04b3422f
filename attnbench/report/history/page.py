"""A history as a static HTML page: the runs, then per GPU kind its steps (each with a small
inline SVG of the case's values over the runs, the step's run marked) and its cases.

Built of the dashboard's parts (:mod:`attnbench.report.page.html`: the page, its CSS and
sorting script, :func:`esc` for every text from a file, the output folder claimed as every
dashboard claims it). No image files: the figures are a few hundred bytes of SVG each.
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Sequence

import numpy as np

from attnbench.report.history.collect import HistoryRun
from attnbench.report.history.series import METRICS, UNITS, CaseHistory, FoundStep, GpuHistory
from attnbench.report.history.table import code_text, commit_text, run_names, when
from attnbench.report.page.html import (abandon_output_dir, claim_output_dir, esc,
                                        finish_output_dir, fmt, page, sort_key, verdict_badge)
from attnbench.results.files import write_atomic

MAX_STEPS_DRAWN = 1_000  # step rows (each with its SVG, ~0.6 KB) per GPU kind
MAX_CASES_LISTED = 5_000  # case rows per GPU kind: ~0.5 KB of HTML each
WIDTH, HEIGHT, PAD = 180, 40, 4  # the sparkline, in px


def sparkline(values: np.ndarray, marks: Sequence[int] = ()) -> str:
    """The values over the runs as an SVG line (a dot per run with a value), a dashed line
    before each run in ``marks``; numbers only, nothing from a file."""
    finite = [(j, float(v)) for j, v in enumerate(values) if math.isfinite(v)]
    if not finite:
        return ""
    lo, hi = min(v for _, v in finite), max(v for _, v in finite)
    span = (hi - lo) or (abs(hi) or 1.0)
    n = max(len(values) - 1, 1)

    def x(j: float) -> float:
        return PAD + (WIDTH - 2 * PAD) * j / n

    def y(v: float) -> float:
        return HEIGHT - PAD - (HEIGHT - 2 * PAD) * (v - lo) / span

    points = " ".join(f"{x(j):.1f},{y(v):.1f}" for j, v in finite)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img">']
    for j in marks:
        parts.append(f'<line x1="{x(j - 0.5):.1f}" x2="{x(j - 0.5):.1f}" y1="0" y2="{HEIGHT}" '
                     'stroke="#b0151a" stroke-dasharray="3,2"/>')
    parts.append(f'<polyline points="{points}" fill="none" stroke="#2a6f97" stroke-width="1.5"/>')
    parts += [f'<circle cx="{x(j):.1f}" cy="{y(v):.1f}" r="2" fill="#2a6f97"/>' for j, v in finite]
    return "".join(parts) + "</svg>"


def header(runs: Sequence[HistoryRun], order: str, command: Sequence[str]) -> str:
    rows = []
    for i, r in enumerate(runs):
        commit = (r.commit or "?")[:12] + (" (dirty)" if r.dirty else "")
        rows.append(f"<dt>r{i + 1}</dt><dd><code>{esc(r.run_id)}</code> — commit "
                    f"<code>{esc(commit)}</code> of {esc(when(r.commit_date))}; began "
                    f"{esc(when(r.created))}</dd>")
    return (f'<header class="run"><h1>attnbench history</h1>'
            f'<div class="sub"><code>{esc(shlex.join(command))}</code></div>'
            f'<div class="sub">{len(runs)} runs in {esc(order)} order</div>'
            f'<dl>{"".join(rows)}</dl></header>')


def _step_row(case: CaseHistory, step: FoundStep, h: GpuHistory, names: Sequence[str]) -> str:
    s = step.step
    change = (s.ratio - 1) * 100 if math.isfinite(s.ratio) else math.inf
    before, after = h.runs[step.before], h.runs[step.run]
    marks = [t.run for t in case.steps if t.metric == step.metric]
    cls = " over" if step.rise else ""
    return (f"<tr><td>{esc(UNITS[step.metric])}</td>"
            f'<td class="num{cls}" data-sort="{sort_key(change)}">{esc(f"{change:+.1f}%")}</td>'
            f'<td class="num">{esc(fmt(s.before, 4))} → {esc(fmt(s.after, 4))}</td>'
            f'<td data-sort="{step.run:06d}">{esc(names[step.run])} <code>{esc(after.run_id)}'
            f"</code><br>after {esc(names[step.before])}</td>"
            f"<td>{esc(commit_text(before, after))}</td>"
            f"<td>{esc(code_text(step, case.backend))}</td>"
            f"<td>{sparkline(case.values[step.metric], marks)}</td>"
            f'<td class="case">{esc(case.label)}</td></tr>')


def _case_row(case: CaseHistory) -> str:
    cells = [f'<td class="case">{esc(case.label)}</td><td>{esc(case.backend)}</td>',
             f'<td class="num">{len(case.steps)}</td>']
    last = next((v for v in reversed(case.verdicts) if v), "")
    cells.append(f'<td data-sort="{esc(last)}">{verdict_badge(last) if last else ""}</td>')
    for metric in METRICS:
        values = case.values[metric]
        latest = next((float(v) for v in values[::-1] if math.isfinite(v)), math.nan)
        marks = [t.run for t in case.steps if t.metric == metric]
        cells.append(f'<td class="num" data-sort="{sort_key(latest)}">{esc(fmt(latest, 4))}'
                     f"<br>{sparkline(values, marks)}</td>")
    return f"<tr>{''.join(cells)}</tr>"


def gpu_section(h: GpuHistory, runs: Sequence[HistoryRun], anchor: str) -> str:
    names = run_names(h, runs)
    steps = h.steps
    parts = [f'<section id="{anchor}"><h2>{esc(h.gpu)}</h2>',
             f'<p class="desc">{len(h.runs)} runs ({esc(", ".join(names))}), {len(h.cases)} '
             f"cases, {len(steps)} steps. A step is a new level of a case's time or error that "
             "held for at least two runs (docs/history.md says the rule).</p>"]
    if steps:
        head = ("<tr><th>metric</th><th>change</th><th>level before → after</th>"
                "<th>appeared in</th><th>commit</th><th>backend code</th><th>over the runs</th>"
                "<th>case</th></tr>")
        rows = "".join(_step_row(c, s, h, names) for c, s in steps[:MAX_STEPS_DRAWN])
        parts.append(f'<h3>Steps</h3><table class="records sortable"><thead>{head}</thead>'
                     f"<tbody>{rows}</tbody></table>")
        if len(steps) > MAX_STEPS_DRAWN:
            parts.append(f'<p class="note">{len(steps) - MAX_STEPS_DRAWN} more steps: '
                         "--format json lists all.</p>")
    ordered = sorted(h.cases, key=lambda c: -len(c.steps))
    head = ("<tr><th>case</th><th>backend</th><th>steps</th><th>last verdict</th>"
            + "".join(f"<th>{esc(UNITS[m])} (latest)</th>" for m in METRICS) + "</tr>")
    rows = "".join(_case_row(c) for c in ordered[:MAX_CASES_LISTED])
    parts.append(f'<h3>Cases</h3><table class="records sortable"><thead>{head}</thead>'
                 f"<tbody>{rows}</tbody></table>")
    if len(ordered) > MAX_CASES_LISTED:
        parts.append(f'<p class="note">{len(ordered) - MAX_CASES_LISTED} more cases: '
                     "--format json lists all.</p>")
    return "".join(parts) + "</section>"


def build_history_page(histories: Sequence[GpuHistory], runs: Sequence[HistoryRun], order: str,
                       out_dir: Path, command: Sequence[str]) -> Path:
    """Write ``out_dir/index.html``; returns its path. :class:`ReportError` when ``out_dir`` is
    not attnbench's to write (:func:`claim_output_dir`)."""
    claim = claim_output_dir(Path(out_dir))
    try:
        sections, nav = [], []
        for i, h in enumerate(histories):
            anchor = f"gpu{i + 1}"
            nav.append((anchor, h.gpu))
            sections.append(gpu_section(h, runs, anchor))
        index = Path(out_dir) / "index.html"
        write_atomic(index, page("attnbench history · " + ", ".join(h.gpu for h in histories),
                                 header(runs, order, command), nav, "\n".join(sections)))
    except BaseException:
        abandon_output_dir(claim)  # a failed page leaves no empty directory behind
        raise
    finish_output_dir(claim, [index])
    return index
