"""The report of one run: draw the dashboard's panels, then write ``index.html`` beside them.

The header names the exact hardware and software of the run's devices (from the records' env);
the summary never counts a "timed" case (accuracy not checked) as a pass; the records table
shows achieved GB/s and peak memory beside TFLOP/s and badges the timings that never settled.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.report.page.dashboard import Dashboard
from attnbench.report.read.data import Run
from attnbench.report.read.environment import hardware_text, software_text
from attnbench.report.page.figures import Context, PanelOutput, page_colors
from attnbench.report.page.html import (abandon_output_dir, claim_output_dir, esc,
                                        filter_controls, finish_output_dir, fmt, noisy_badge,
                                        page, panel_section, repro_command, sort_key,
                                        totals_html, verdict_badge)
from attnbench.report.page.interactive import KINDS as INTERACTIVE
from attnbench.report.page.interactive import PAGE as INTERACTIVE_PAGE
from attnbench.report.page.interactive import write_interactive
from attnbench.report.page.panels import draw_panel
from attnbench.report.read.reader import MAX_FAILURES_LISTED
from attnbench.report.page.style import fmt_bytes, verdict_label
from attnbench.results.files import write_atomic
from attnbench.results.records import BAD_VERDICTS, SEVERITY

TABLE_ID = "records"
ENV_CLASS = ' class="env"'
MAX_RECORDS_LISTED = 5_000
"""Rows of the All records table: ~1 KB of HTML each, so a run of 10^6 cases would make a page
of a GB; past this the table lists the most severe verdicts first and a line counts the rest."""
MAX_ENVIRONMENTS_SHOWN = 6  # distinct device set-ups in the header; a note counts the rest


def build_report(run: Run, dashboard: Dashboard, out_dir: Path) -> Path:
    """Draw into ``out_dir`` (new, empty, or a dashboard attnbench wrote: see
    :func:`~attnbench.report.page.html.claim_output_dir`); figures of an earlier report there that
    this one does not draw are removed (the panel list may differ)."""
    claim = claim_output_dir(out_dir)
    try:
        ctx = Context(out_dir=out_dir, colors=page_colors([run.frame]))
        outputs = [draw_panel(p, run, ctx) for p in dashboard.panels]
        interactive = write_interactive(run, dashboard, out_dir, ctx.colors)
        index = out_dir / "index.html"
        write_atomic(index, render(run, dashboard, outputs, interactive is not None))
    except BaseException:
        abandon_output_dir(claim)
        raise
    finish_output_dir(claim, [p for o in outputs for f in o.figures for p in (f.png, f.svg)]
                      + ([interactive] if interactive else []))
    return index


def render(run: Run, dashboard: Dashboard, outputs: list[PanelOutput],
           interactive: bool = False) -> str:
    nav = [("summary", "Summary")]
    nav += [(o.panel.slug, o.panel.title.split(":")[0]) for o in outputs]
    nav += [("failures", "Failures"), ("all-records", "All records")]
    body = [summary_section(run, dashboard)]
    # a panel with nothing drawn has no section on the interactive page to link to
    body += [_with_link(panel_section(o), o)
             if interactive and o.panel.kind in INTERACTIVE and o.figures
             else panel_section(o) for o in outputs]
    body.append(failures_section(run))
    body.append(records_section(run, dashboard))
    sweep_name = (run.manifest.get("sweep") or {}).get("name") or run.run_id
    return page(f"attnbench · {sweep_name} · {run.run_id}", run_header(run, dashboard), nav,
                "\n".join(body))


def _with_link(section_html: str, output: PanelOutput) -> str:
    """A panel drawn on the interactive page too links to its plots there, under its title."""
    link = (f'<p class="interactive"><a href="{INTERACTIVE_PAGE}#{esc(output.panel.slug)}">'
            "Explore these plots interactively</a> (hover for a case and its numbers, zoom, "
            "legend toggles)</p>")
    return section_html.replace("</h2>", "</h2>" + link, 1)


def run_header(run: Run, dashboard: Dashboard) -> str:
    m = run.manifest
    sweep = m.get("sweep") or {}
    devices = m.get("devices") or []
    kinds: dict[str, set[str]] = {}
    for d in devices:
        if isinstance(d, dict) and d.get("gpu_kind"):
            kinds.setdefault(d["gpu_kind"], set()).add(d.get("device_name") or "")
    for kind, name in run.frame[["gpu_kind", "device_name"]].dropna().drop_duplicates().itertuples(
            index=False):
        kinds.setdefault(kind, set()).add(name)
    where = ", ".join(f"{k} ({', '.join(sorted(n for n in names if n))})" if any(names) else k
                      for k, names in sorted(kinds.items())) or "unknown"
    hosts = m.get("hosts") or sorted(set(run.frame.host.dropna()))
    versions = dict(m.get("versions") or {})
    if m.get("attnbench"):
        versions = {"attnbench": m["attnbench"], **versions}
    rows = [
        ("Sweep", f"{esc(sweep.get('name', '?'))} — <code>{esc(sweep.get('path', '?'))}</code>"
                  f" (digest {esc(sweep.get('digest', '?'))})", True),
        ("When", m.get("created", "?"), False),
        ("Where", f"{where}; hosts: {', '.join(map(str, hosts)) or '?'}", False),
        ("Versions", ", ".join(f"{k} {v}" for k, v in versions.items()) or "?", False),
        ("Command", f"<code>{esc(shlex.join(map(str, m.get('command') or [])) or '?')}</code>",
         True),
    ]
    rows += environment_rows(run)
    planned = sweep.get("cases")
    recorded = f"{len(run.frame)} records" + (f" of {planned} planned cases" if planned else "")
    dl = "".join(f"<dt>{esc(k)}</dt><dd{ENV_CLASS if k in ('', 'Devices') else ''}>"
                 f"{v if raw else esc(v)}</dd>" for k, v, raw in rows)
    missing = ('<p class="sub">manifest.json is missing: run details unknown.</p>'
               if m.get("missing") else "")
    title = sweep.get("name") or run.run_id
    return (f'<header class="run"><h1>{esc(dashboard.title)} · {esc(title)}</h1>'
            f'<div class="sub">run <code>{esc(run.run_id)}</code> · {esc(recorded)} · dashboard '
            f'<code>{esc(dashboard.path)}</code></div>{missing}<dl>{dl}</dl>'
            f'<div class="totals" id="totals">{totals_html(run.frame.verdict)}</div></header>')


def environment_rows(run: Run) -> list[tuple[str, str, bool]]:
    """Header rows (name, HTML, raw) naming each distinct hardware + software set-up of the
    run's records, with how many devices and records it covers. Escaped here."""
    found = run.environments
    rows = []
    for n, env in enumerate(found[:MAX_ENVIRONMENTS_SHOWN]):
        hardware, software = hardware_text(env.view), software_text(env.view)
        share = f"{len(env.devices)} device(s), {env.records} record(s)"
        text = f"{esc(hardware)} <span class=\"muted\">— {esc(share)}</span>" + (
            f"<br>{esc(software)}" if software else "")
        rows.append(("Devices" if n == 0 else "", text, True))
    if len(found) > MAX_ENVIRONMENTS_SHOWN:
        rows.append(("", esc(f"and {len(found) - MAX_ENVIRONMENTS_SHOWN} more set-ups "
                             "(driver, versions or clocks differ between records)"), True))
    return rows


def summary_section(run: Run, dashboard: Dashboard) -> str:
    df = run.frame
    bad = df[df.verdict.isin(BAD_VERDICTS)]
    parts = ['<section id="summary"><h2>Summary</h2>']
    if dashboard.description:
        parts.append(f'<p class="desc">{esc(dashboard.description)}</p>')
    timed = int((df.verdict == "timed").sum()) if len(df) else 0
    if len(df) == 0:
        parts.append('<p class="note">This run has no records yet.</p>')
    elif bad.empty and not timed:
        parts.append(f"<p>All {len(df)} recorded cases passed or were not applicable.</p>")
    elif bad.empty:
        passed = int((df.verdict == "pass").sum())
        parts.append(f"<p>No failures in {len(df)} recorded cases: {passed} passed, "
                     f"{len(df) - passed - timed} not applicable.</p>")
    else:
        by = bad.groupby(["backend", "verdict"]).size().reset_index(name="n")
        items = []
        for backend, sub in by.groupby("backend"):
            counts = " ".join(verdict_badge(v, int(n)) for v, n in
                              sorted(zip(sub.verdict, sub.n), key=lambda vn: SEVERITY.index(vn[0])))
            feats = sorted(set(bad[bad.backend == backend].features))
            shown = ", ".join(feats[:8]) + (f" and {len(feats) - 8} more" if len(feats) > 8 else "")
            items.append(f"<li><b>{esc(backend)}</b> {counts} — in {esc(shown)}</li>")
        parts.append(f"<p>{len(bad)} of {len(df)} cases did not pass:</p><ul>{''.join(items)}</ul>")
        parts.append(common_html(run.commonality))
    if timed:
        parts.append(f"<p>{timed} of {len(df)} cases are {verdict_badge('timed')}: they ran "
                     "with <code>accuracy: false</code> (timed, and checked for NaN/Inf only), "
                     "so they are not passes.</p>")
    parts.append("</section>")
    return "\n".join(parts)


def common_html(lines: list[str]) -> str:
    """What the failing cases share (the lines ``attnbench show`` prints: a heading, then a line
    per backend), escaped: backend names and case values come from the records."""
    if not lines:
        return ""
    head, *rest = lines
    items = "".join(f"<li>{esc(line.strip())}</li>" for line in rest)
    return f'<p class="common">{esc(head)}</p><ul class="common">{items}</ul>'


def failures_section(run: Run) -> str:
    df = run.frame
    bad = df[df.verdict.isin(BAD_VERDICTS)].copy()
    parts = ['<section id="failures"><h2>Failures</h2>']
    if bad.empty:
        parts.append("<p>None.</p></section>")
        return "\n".join(parts)
    parts.append('<p class="desc">Each command reruns that case alone.</p>')
    bad["_s"] = bad.verdict.map({v: i for i, v in enumerate(SEVERITY)})
    bad = bad.sort_values(["_s", "backend", "features", "label"])
    crashes = run.crashes  # those of the failures listed here (report.reading)
    rows = []
    for r in bad.head(MAX_FAILURES_LISTED).itertuples():
        detail = ""
        crash = crashes.get(r.id)
        if crash:
            text = (crash.get("stderr_tail") or "") + ("\n" + crash["traceback"]
                                                      if crash.get("traceback") else "")
            head = (f"{crash.get('signal') or ''} exit {crash.get('exit_code')} "
                    f"rank {crash.get('rank')}")
            detail = f"<details><summary>{esc(head)}</summary><pre>{esc(text)}</pre></details>"
        rows.append(
            f'<tr data-verdict="{esc(r.verdict)}"><td>{verdict_badge(r.verdict)}</td>'
            f"<td>{esc(r.label)}<br><code>{esc(r.id)}</code></td><td>{esc(r.reason)}{detail}</td>"
            f'<td><code class="cmd">{esc(repro_command(run.sweep_path, r.id))}</code></td></tr>')
    more = len(bad) - MAX_FAILURES_LISTED
    parts.append('<table class="records"><thead><tr><th>verdict</th><th>case</th><th>reason</th>'
                 f"<th>reproduce</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")
    if more > 0:
        parts.append(f'<p class="note">{more} more; the table below lists them all.</p>')
    parts.append("</section>")
    return "\n".join(parts)


def _texts(column: pd.Series) -> set[str]:
    """The texts of a column's values, each distinct value's once where its type is one (a
    category, text, numbers: 1.5 s a column at 10^6 rows as a loop over them); an object
    column is read whole (1 and True are one value to ``unique``, two texts here)."""
    values = column.dropna()
    return {str(v) for v in (values if values.dtype == object else values.unique().tolist())}


def records_section(run: Run, dashboard: Dashboard) -> str:
    df = run.frame
    filters = list(dashboard.table_filters)
    controls = filter_controls(TABLE_ID, [
        (col, col, [(v, verdict_label(v)) if col == "verdict" else v for v in
                    sorted(_texts(df[col]), key=_filter_order(col))])
        for col in filters if col in df])
    severity = {v: i for i, v in enumerate(SEVERITY)}
    head = ("<tr><th>verdict</th><th>backend</th><th>features</th><th>dtype</th>"
            "<th>seqlen q/kv</th><th>heads q/kv</th><th>GPU</th><th>worst err/bound</th>"
            "<th>fwd TFLOP/s</th><th>bwd TFLOP/s</th><th>fwd GB/s</th><th>bwd GB/s</th>"
            '<th title="peak device memory of one call, forward / backward">peak mem</th>'
            "<th>reason · reproduce</th><th>case</th></tr>")
    rows = []
    attr_cols = list(dict.fromkeys(["verdict", "backend", "features", *filters]))
    shown, more = _listed(df, severity)
    for r in shown.itertuples():
        attrs = " ".join(f'data-{esc(col)}="{esc(_cell(getattr(r, col)))}"' for col in attr_cols
                         if col in df)
        over = r.worst_over
        over_cls = ' over' if isinstance(over, float) and over > 1 else ""
        cmd = (f'<br><code class="cmd">{esc(repro_command(run.sweep_path, r.id))}</code>'
               if r.verdict in BAD_VERDICTS else "")
        rows.append(
            f"<tr {attrs}>"
            f'<td data-sort="{severity.get(r.verdict, 99)}">{verdict_badge(r.verdict)}</td>'
            f"<td>{esc(r.backend)}</td><td>{esc(r.features)}</td><td>{esc(r.dtype)}</td>"
            f'<td class="num" data-sort="{sort_key(r.seqlen_q)}">'
            f"{esc(r.seqlen_q)}/{esc(r.seqlen_kv)}</td>"
            f'<td class="num" data-sort="{sort_key(r.heads_q)}">'
            f"{esc(r.heads_q)}/{esc(r.heads_kv)}</td>"
            f'<td class="kind">{esc(_cell(r.gpu_kind))}</td>'
            f'<td class="num{over_cls}" data-sort="{sort_key(over)}">{esc(fmt(over))}</td>'
            f"{_timing_cells(r)}"
            f'<td class="reason">{esc(r.reason)}{cmd}</td>'
            f'<td class="case">{esc(r.label)}<br><code>{esc(r.id)}</code></td></tr>')
    return (f'<section id="all-records"><h2>All records</h2>'
            '<p class="desc">Click a column header to sort; pick values to filter.</p>'
            f'{controls}<table class="records sortable" id="{TABLE_ID}"><thead>{head}</thead>'
            f"<tbody>{''.join(rows)}</tbody></table>{more}</section>")


def _listed(df: pd.DataFrame, severity: dict[str, int]) -> tuple[pd.DataFrame, str]:
    """The rows the table lists (all, or the first MAX_RECORDS_LISTED by severity, in file
    order within one verdict) and the note that counts the rest ("" when none is left out)."""
    if len(df) <= MAX_RECORDS_LISTED:
        return df, ""
    rank = df.verdict.map(lambda v: severity.get(v, 99)).to_numpy()
    shown = df.iloc[rank.argsort(kind="stable")[:MAX_RECORDS_LISTED]]
    return shown, (f'<p class="note">{len(df) - MAX_RECORDS_LISTED} more records, not listed '
                   f"(at most {MAX_RECORDS_LISTED}, the most severe verdicts first): "
                   "<code>attnbench export</code> writes them all.</p>")


def _timing_cells(r) -> str:
    """TFLOP/s (a "noisy" badge where the spread never settled), GB/s, and peak memory."""
    cells = []
    for d in ("fwd", "bwd"):
        value = getattr(r, f"{d}_tflops")
        badge = " " + noisy_badge() if getattr(r, f"{d}_noisy") else ""
        cells.append(f'<td class="num" data-sort="{sort_key(value)}">{esc(fmt(value))}{badge}'
                     "</td>")
    for d in ("fwd", "bwd"):
        value = getattr(r, f"{d}_gbps")
        cells.append(f'<td class="num" data-sort="{sort_key(value)}">{esc(fmt(value))}</td>')
    memory = [getattr(r, f"{d}_peak_memory_bytes") for d in ("fwd", "bwd")]
    shown = " / ".join(fmt_bytes(m) or "?" for m in memory) if any(
        not pd.isna(m) for m in memory) else ""
    top = max((m for m in memory if not pd.isna(m)), default=None)
    cells.append(f'<td class="num" data-sort="{sort_key(top)}">{esc(shown)}</td>')
    return "".join(cells)


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    return str(value)


def _filter_order(col: str):
    if col == "verdict":
        return lambda v: (SEVERITY.index(v) if v in SEVERITY else 99, v)
    return lambda v: (len(v), v) if v.isdigit() else (0, v)
