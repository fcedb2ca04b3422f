"""Self-contained HTML: one file, images beside it by relative path, inline CSS and vanilla JS.

Works from a ``file://`` URL and from any static server. Every string that comes from a record,
a manifest or a dashboard file goes through :func:`esc` (``html.escape``) before it reaches
the page.
"""

from __future__ import annotations

import errno
import html
import json
import math
import os
import shlex
import stat
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from attnbench.errors import ReportError
from attnbench.report.page.figures import PanelOutput
from attnbench.report.page.style import (CLASS_COLORS, NOISY_TITLE, VERDICT_COLORS, VERDICT_TITLES,
                                    text_color_on, verdict_label)
from attnbench.results.files import write_atomic
from attnbench.results.records import SEVERITY
from attnbench.results.store import MANIFEST, RECORDS
from attnbench.validation import read_bounded


MAX_TEXT_SHOWN = 20_000
"""Characters of one value a page shows (a reason, a crash's stderr and traceback, a label): the
longest text attnbench writes into a record is a crash's (a 40-line stderr tail, a few KB, and
the traceback's last 4,000 characters), so this shows every text attnbench wrote whole; a
hand-made 100 MB reason is cut here, with a note, instead of landing whole in index.html (the
terminal cuts at 2,000 per line; the journal keeps all of it)."""


def esc(value: Any, limit: int = MAX_TEXT_SHOWN) -> str:
    """``value`` as HTML text, escaped, and cut after ``limit`` characters."""
    text = "" if value is None else str(value)
    if len(text) > limit:
        text = f"{text[:limit]} [... {len(text) - limit} more characters: see records.jsonl]"
    return html.escape(text, quote=True)


CSS = """
:root { --fg: #1d2330; --muted: #5b6475; --line: #e3e6ec; --bg-soft: #f6f7f9; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       color: var(--fg); margin: 0; background: #fff; }
header.run { background: #1d2330; color: #fff; padding: 18px 28px 14px; }
header.run h1 { margin: 0 0 4px; font-size: 22px; font-weight: 600; }
header.run .sub { color: #c5cbd6; font-size: 13px; }
header.run dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px;
                margin: 12px 0 10px; font-size: 13px; }
header.run dt { color: #9aa3b2; } header.run dd { margin: 0; }
header.run code { color: #e8ecf3; }
nav.toc { position: sticky; top: 0; z-index: 5; background: #fff; padding: 8px 28px;
          border-bottom: 1px solid var(--line); font-size: 13px; }
nav.toc a { margin-right: 16px; color: #2a6f97; text-decoration: none; }
nav.toc a:hover { text-decoration: underline; }
main { padding: 8px 28px 40px; max-width: 1800px; }
section { margin: 26px 0 10px; }
section h2 { font-size: 18px; margin: 0 0 4px; padding-bottom: 4px;
             border-bottom: 2px solid var(--line); }
p.desc, p.note { color: var(--muted); margin: 4px 0 10px; max-width: 110ch; }
p.note::before { content: "Note: "; font-weight: 600; }
.figs { display: flex; flex-wrap: wrap; gap: 18px; align-items: flex-start; }
figure { margin: 0; border: 1px solid var(--line); border-radius: 6px; padding: 8px;
         background: #fff; max-width: 100%; }
figure img { display: block; max-width: 100%; height: auto; }
figcaption { font-size: 12px; color: var(--muted); margin-top: 6px; max-width: 95ch; }
figcaption a { color: #2a6f97; }
.badge { display: inline-block; padding: 1px 7px; border-radius: 10px; font-size: 12px;
         font-weight: 600; white-space: nowrap; }
.totals .badge { margin: 2px 6px 2px 0; font-size: 13px; padding: 2px 9px; }
table.records { border-collapse: collapse; width: 100%; font-size: 12.5px; }
table.records th, table.records td { border-bottom: 1px solid var(--line); padding: 4px 6px;
         text-align: left; vertical-align: top; }
table.records th { background: var(--bg-soft); position: sticky; top: 37px; cursor: pointer;
         user-select: none; white-space: nowrap; }
table.records th[aria-sort="ascending"]::after { content: " \\25B2"; font-size: 10px; }
table.records th[aria-sort="descending"]::after { content: " \\25BC"; font-size: 10px; }
table.records td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.records td.over { color: #b0151a; font-weight: 600; }
table.records tr:hover td { background: #fbfbfd; }
td code, pre { font: 12px/1.4 ui-monospace, "DejaVu Sans Mono", monospace; }
td code.cmd { background: var(--bg-soft); padding: 1px 4px; border-radius: 3px; user-select: all;
              display: inline-block; margin-top: 2px; }
td.case { font-size: 11.5px; min-width: 24ch; color: var(--muted); }
td.reason { min-width: 30ch; max-width: 70ch; }
td.kind { white-space: nowrap; }
pre { background: var(--bg-soft); padding: 8px; overflow-x: auto; max-height: 320px; }
.filters { display: flex; flex-wrap: wrap; gap: 10px; align-items: center; margin: 8px 0; }
.filters label { font-size: 13px; color: var(--muted); }
.filters select, .filters input { font: inherit; font-size: 13px; padding: 2px 4px; }
.filters span { font-size: 13px; color: var(--muted); }
details summary { cursor: pointer; color: #2a6f97; }
.badge.noisy { background: #fff3cd; color: #6b4e00; border: 1px dashed #b8860b; font-weight: 500;
               font-size: 11px; padding: 0 5px; }
ul.warn { background: #fff8e1; border-left: 4px solid #f2b01c; padding: 6px 10px 6px 28px;
          margin: 6px 0 10px; max-width: 110ch; }
ul.warn li { margin: 1px 0; }
.muted { color: var(--muted); font-size: 12px; }
header.run dd.env { font-size: 12.5px; }
header.run .muted { color: #9aa3b2; }
"""

JS = """
(function () {
  "use strict";
  function cellValue(row, idx) {
    var cell = row.cells[idx];
    if (!cell) { return ""; }
    var v = cell.getAttribute("data-sort");
    return v === null ? cell.textContent.trim() : v;
  }
  function sortTable(table, idx, th) {
    var tbody = table.tBodies[0];
    var rows = Array.prototype.slice.call(tbody.rows);
    var asc = th.getAttribute("aria-sort") !== "ascending";
    var numeric = rows.every(function (r) {
      var v = cellValue(r, idx); return v === "" || !isNaN(parseFloat(v));
    });
    rows.sort(function (a, b) {
      var x = cellValue(a, idx), y = cellValue(b, idx), c;
      if (numeric) {
        var fx = x === "" ? Infinity : parseFloat(x), fy = y === "" ? Infinity : parseFloat(y);
        c = fx === fy ? 0 : (fx < fy ? -1 : 1);
      } else {
        c = x.localeCompare(y, undefined, {numeric: true});
      }
      return asc ? c : -c;
    });
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (h) {
      h.removeAttribute("aria-sort");
    });
    th.setAttribute("aria-sort", asc ? "ascending" : "descending");
    rows.forEach(function (r) { tbody.appendChild(r); });
  }
  function applyFilters(table) {
    var selects = document.querySelectorAll("select[data-filter][data-table='" + table.id + "']");
    var search = document.querySelector("input[data-search][data-table='" + table.id + "']");
    var needle = search ? search.value.trim().toLowerCase() : "";
    var shown = 0, total = 0;
    Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
      var ok = true;
      Array.prototype.forEach.call(selects, function (sel) {
        var attr = "data-" + sel.getAttribute("data-filter");
        if (sel.value !== "" && row.getAttribute(attr) !== sel.value) { ok = false; }
      });
      if (ok && needle && row.textContent.toLowerCase().indexOf(needle) < 0) { ok = false; }
      row.hidden = !ok;
      total += 1; if (ok) { shown += 1; }
    });
    var count = document.getElementById(table.id + "-count");
    if (count) { count.textContent = shown + " of " + total + " rows shown"; }
  }
  document.addEventListener("DOMContentLoaded", function () {
    Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), function (table) {
      Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, idx) {
        th.addEventListener("click", function () { sortTable(table, idx, th); });
      });
      Array.prototype.forEach.call(
        document.querySelectorAll("[data-table='" + table.id + "']"), function (el) {
          el.addEventListener(el.tagName === "INPUT" ? "input" : "change", function () {
            applyFilters(table);
          });
        });
      applyFilters(table);
    });
  });
}());
"""


def page(title: str, header_html: str, nav: Sequence[tuple[str, str]], body_html: str) -> str:
    toc = "".join(f'<a href="#{esc(anchor)}">{esc(text)}</a>' for anchor, text in nav)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{esc(title)}</title>\n"
        # an empty icon: no favicon request, so no 404 in the console on a static server
        "<link rel=\"icon\" href=\"data:,\">\n"
        f"<style>{CSS}</style>\n</head>\n<body>\n{header_html}\n"
        f"<nav class=\"toc\">{toc}</nav>\n<main>\n{body_html}\n</main>\n"
        f"<script>{JS}</script>\n</body>\n</html>\n"
    )


def verdict_badge(verdict: str, count: int | None = None) -> str:
    """The verdict in its colour, by the name a reader sees ("timed" reads "not judged")."""
    color = VERDICT_COLORS.get(verdict, "#777777")
    label = verdict_label(verdict)
    text = f"{count} {label}" if count is not None else label
    title = f' title="{esc(VERDICT_TITLES[verdict])}"' if verdict in VERDICT_TITLES else ""
    return (f'<span class="badge v-{esc(verdict)}" style="background:{color};'
            f'color:{text_color_on(color)}"{title}>{esc(text)}</span>')


def noisy_badge(title: str = NOISY_TITLE) -> str:
    """Marks a number whose timing never settled (``timing.<d>.noisy``)."""
    return f'<span class="badge noisy" title="{esc(title)}">noisy</span>'


def class_badge(cls: str, count: int | None = None) -> str:
    color = CLASS_COLORS.get(cls, "#777777")
    text = f"{count} {cls}" if count is not None else cls
    return (f'<span class="badge c-{esc(cls)}" style="background:{color};'
            f'color:{text_color_on(color)}">{esc(text)}</span>')


def totals_html(verdicts: Iterable[str]) -> str:
    counts = Counter(verdicts)
    order = [v for v in SEVERITY if v in counts] + sorted(v for v in counts if v not in SEVERITY)
    return "".join(verdict_badge(v, counts[v]) for v in order)


def panel_section(output: PanelOutput) -> str:
    p = output.panel
    parts = [f'<section id="{esc(p.slug)}" data-kind="{esc(p.kind)}">', f"<h2>{esc(p.title)}</h2>"]
    if p.description:
        parts.append(f'<p class="desc">{esc(p.description)}</p>')
    for note in output.notes:
        parts.append(f'<p class="note">{esc(note)}</p>')
    if output.figures:
        parts.append('<div class="figs">')
        for f in output.figures:
            parts.append(
                f'<figure><a href="{esc(f.svg.name)}" title="open the SVG">'
                f'<img src="{esc(f.png.name)}" width="{f.width_px}" height="{f.height_px}" '
                f'alt="{esc(f.caption)}"></a>'
                f'<figcaption>{esc(f.caption)} '
                f'<a href="{esc(f.png.name)}">PNG</a> · <a href="{esc(f.svg.name)}">SVG</a>'
                "</figcaption></figure>")
        parts.append("</div>")
    parts.append("</section>")
    return "\n".join(parts)


def repro_command(sweep_path: str | None, case_id: str) -> str:
    return shlex.join(["attnbench", "run", sweep_path or "SWEEP.yaml", "--case", case_id])


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return ""
    try:
        f = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(f):
        return ""
    if math.isinf(f):
        return "inf"
    return f"{f:.{digits}g}"


def sort_key(value: Any) -> str:
    """data-sort attribute value, escaped: plain number for numbers (empty when missing), text
    otherwise (a record's field may hold any text: ``"><img onerror=...>`` stays text)."""
    try:
        f = float(value)
    except (TypeError, ValueError, OverflowError):
        return "" if value is None else esc(value)
    if math.isnan(f):
        return ""
    return "1e308" if math.isinf(f) else repr(f)


def filter_controls(table_id: str, columns: Sequence[tuple[str, str, list[Any]]]) -> str:
    """``columns``: (data attribute name, label, values); a value is the attribute's value, or
    a (value, text shown) pair."""
    parts = ['<div class="filters" role="search">']
    for attr, label, values in columns:
        pairs = [v if isinstance(v, tuple) else (v, v) for v in values]
        opts = "".join(f'<option value="{esc(v)}">{esc(t)}</option>' for v, t in pairs)
        parts.append(f'<label>{esc(label)} <select data-filter="{esc(attr)}" '
                     f'data-table="{esc(table_id)}" id="{esc(table_id)}-f-{esc(attr)}">'
                     f'<option value="">all</option>{opts}</select></label>')
    parts.append(f'<label>search <input type="search" data-search="1" data-table="{esc(table_id)}" '
                 f'id="{esc(table_id)}-search" placeholder="label, reason, id..."></label>')
    parts.append(f'<span id="{esc(table_id)}-count"></span></div>')
    return "".join(parts)


# -- the output directory ----------------------------------------------------------------------

MARKER = ".attnbench-dashboard"
"""Written into every directory attnbench draws a dashboard in: the files it wrote there (JSON
list). Only those are replaced or removed by the next report into the same directory."""
MAX_MARKER_BYTES = 1 << 20
"""The largest marker read (1 MiB): it lists a dashboard's file names, a few KB."""
DRAWN_SUFFIXES = (".html", ".png", ".svg")
"""What a dashboard writes: pages and figures. A name the marker lists with another suffix was
not written by attnbench (a planted marker naming ``records.jsonl``) and is never removed."""
RUN_PAGES = ("dask-performance.html",)
"""A run's own page (``run`` writes it beside the journal): never a dashboard's to remove. The
run's other files (journal, manifest, driver state, lock) have no drawn suffix."""
_NOFOLLOW_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) \
    | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class OutputDir:
    """A directory claimed for a dashboard (:func:`claim_output_dir`): ``old``, the names an
    earlier dashboard wrote there (removed once the new one is written, if it does not write
    them again); ``made``: created by this claim (removed again if drawing fails); ``ident``:
    the directory's (device, inode), so a directory swapped for another (a link planted after
    the claim) is not cleaned."""

    path: Path
    old: tuple[str, ...] = ()
    made: bool = False
    ident: tuple[int, int] = (0, 0)


def _listed(names: list[str]) -> tuple[str, ...]:
    """The names of a marker that a dashboard could have written: plain file names ending in
    :data:`DRAWN_SUFFIXES`, never a run's own files (a marker is a file a neighbour can plant)."""
    return tuple(n for n in names if "/" not in n and "\0" not in n
                 and n.endswith(DRAWN_SUFFIXES) and n not in RUN_PAGES)


def _identity(out_dir: Path) -> tuple[int, int]:
    """``out_dir``'s (device, inode), opened without following a link: a link there (``ln -s .
    RUN/dashboard``, ``-> ../outside``) is refused, one line, never drawn into or cleaned."""
    try:
        fd = os.open(out_dir, _NOFOLLOW_DIR)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and out_dir.is_symlink():
            raise ReportError(f"{out_dir}: is a symbolic link; attnbench draws only into a "
                              "directory itself, never through a link") from None
        if exc.errno == errno.ENOTDIR:
            raise ReportError(f"{out_dir}: exists and is not a directory; --out names a "
                              "directory") from None
        raise ReportError(f"{out_dir}: cannot open: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    return info.st_dev, info.st_ino


def claim_output_dir(out_dir: Path) -> OutputDir:
    """Make ``out_dir`` ready for a dashboard (:class:`OutputDir`). Refused
    (:class:`ReportError`, exit 2) when it is a file, a link, a run directory, or a non-empty
    directory attnbench did not make: a user's files are never overwritten or deleted."""
    out_dir = Path(out_dir)
    made = False
    if not os.path.lexists(out_dir):
        try:
            out_dir.mkdir(parents=True)
            made = True
        except FileExistsError:
            pass  # made meanwhile: judged below like any other
        except OSError as exc:
            raise ReportError(f"{out_dir}: cannot create: {exc.strerror or exc}") from None
    ident = _identity(out_dir)
    names = sorted(os.listdir(out_dir))
    if not names:
        return OutputDir(out_dir, (), made, ident)
    if MANIFEST in names and RECORDS in names:
        raise ReportError(f"{out_dir}: is a run directory; a dashboard goes in a directory of "
                          "its own (by default RUN/dashboard/)")
    try:
        listed = json.loads(read_bounded(out_dir / MARKER, MAX_MARKER_BYTES))  # not /dev/zero
    except (OSError, ValueError, RecursionError):
        listed = None
    if isinstance(listed, list) and all(isinstance(n, str) for n in listed):
        return OutputDir(out_dir, _listed(listed), made, ident)
    if not _legacy_dashboard(out_dir):
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        raise ReportError(f"{out_dir}: not empty and not a dashboard attnbench wrote "
                          f"({shown}); choose a new or empty --out")
    return OutputDir(out_dir, (), made, ident)


def _legacy_dashboard(out_dir: Path) -> bool:
    """A dashboard written before :data:`MARKER` existed: its index.html is attnbench's."""
    try:
        head = read_bounded(out_dir / "index.html", 4096, whole=False)
    except (OSError, ValueError):
        return False
    head = head.decode("utf-8", "replace")
    return head.startswith("<!DOCTYPE html>") and "<title>attnbench" in head


def finish_output_dir(claim: OutputDir, written: Iterable[Path]) -> None:
    """Record what this dashboard wrote; remove what the previous one wrote and this did not,
    in the claimed directory only (opened again without following links, and checked to be
    the one claimed), and only regular files (a link is never followed to what it names)."""
    names = sorted({Path(p).name for p in written} | {"index.html"})
    try:
        fd = os.open(claim.path, _NOFOLLOW_DIR)
    except OSError as exc:  # a link now, or gone
        raise ReportError(f"{claim.path}: replaced while the dashboard was drawn "
                          f"({exc.strerror or exc}); nothing removed") from None
    try:
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != claim.ident:
            raise ReportError(f"{claim.path}: replaced while the dashboard was drawn; "
                              "nothing removed")
        for name in (n for n in claim.old if n not in names):
            try:
                if stat.S_ISREG(os.lstat(name, dir_fd=fd).st_mode):
                    os.unlink(name, dir_fd=fd)
            except FileNotFoundError:
                pass
    finally:
        os.close(fd)
    write_atomic(claim.path / MARKER, json.dumps(names))


def abandon_output_dir(claim: OutputDir) -> None:
    """A drawing that failed leaves no empty directory behind: the one this claim made is
    removed again when nothing was written into it."""
    if claim.made:
        try:
            claim.path.rmdir()
        except OSError:
            pass  # not empty (a figure was written) or already gone
