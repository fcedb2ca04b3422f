"""``attnbench compare --format json|markdown``: a comparison for machines and for pull requests.

``json`` -- one object, every matched pair with its timing classes, speed ratios, why a pair is
AMBIGUOUS, verdicts and error ratio, and the regressions the gate counted; NaN is null::

    attnbench compare base/ new/ --format json --no-dashboard | jq '.comparisons[0].regressions'

``markdown`` -- fit for a pull-request comment (GitHub-flavoured): a headline with the gate's
outcome, one table of timing classes, the regressions, and the AMBIGUOUS cases with their reason
folded in a ``<details>`` block. Every value that comes from a run (a backend named ``a|b`` or
``<script>``, a label, a reason) is escaped: it cannot break a table or inject HTML.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from pathlib import Path
from typing import Any, Iterator, Sequence, TextIO

from attnbench.errors import printable
from attnbench.report.compare.comparison import (Comparison, ambiguous_reasons, describe, run_facts,
                                      worst_pair)
from attnbench.report.read.data import DIRECTIONS
from attnbench.report.page.style import verdict_label

FORMATS = ("text", "json", "markdown")
MAX_MARKDOWN_ROWS = 30  # a PR comment stays readable; the dashboard and JSON have every row
SCHEMA = "attnbench.compare/1"


# -- JSON -------------------------------------------------------------------------------------

def _plain(value: Any) -> Any:
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _what(r: Any) -> list[str]:
    """What a regression is: ``SLOW fwd``, ``pass -> fail``."""
    what = [f"SLOW {d}" for d in DIRECTIONS if getattr(r, f"{d}_class") == "SLOW" and r.same_kind]
    if r.verdict_regression:
        what.append(f"{r.verdict_a} -> {r.verdict_b}")
    return what


def _pair(r: Any) -> dict[str, Any]:
    out = {"id_a": r.id_a, "id_b": r.id_b, "label": r.label_b, "backend": r.backend_b,
           "gpu_a": r.run_gpu_a, "gpu_b": r.run_gpu_b, "same_gpu_kind": bool(r.same_kind),
           "verdict_a": r.verdict_a, "verdict_b": r.verdict_b,
           "verdict_regression": bool(r.verdict_regression),
           "worst_error_ratio": _plain(r.worst_err_ratio)}
    for d in DIRECTIONS:
        out[d] = {"class": getattr(r, f"{d}_class"),
                  "speed": _plain(getattr(r, f"{d}_speed")),
                  "speed_range": [_plain(getattr(r, f"{d}_speed_lo")),
                                  _plain(getattr(r, f"{d}_speed_hi"))],
                  "median_ms": [_plain(getattr(r, f"{d}_median_ms_a")),
                                _plain(getattr(r, f"{d}_median_ms_b"))],
                  "why": getattr(r, f"{d}_why") or None}
    return out


def _run(run) -> dict[str, Any]:
    return {"run_id": run.run_id, "path": str(run.path), "describe": describe(run),
            "facts": run_facts(run)}


PAIRS_CHUNK = 10_000
"""Pairs named and written at a time (:func:`write_comparison_json`): ~10 MB of their JSON."""


def comparison_json(comps: Sequence[Comparison], fail_on: str, index: Path | None) -> str:
    return "".join(_json_parts(comps, fail_on, index))


def write_comparison_json(comps: Sequence[Comparison], fail_on: str, index: Path | None,
                          stream: TextIO) -> None:
    """:func:`comparison_json` and a newline written to ``stream`` a pair at a time: a list of
    every pair's dict, then json's chunks of it, were ~10 KB a pair (1 GB for 10^5 pairs)."""
    for part in _json_parts(comps, fail_on, index):
        stream.write(part)
    stream.write("\n")


def _json_parts(comps: Sequence[Comparison], fail_on: str, index: Path | None
                ) -> Iterator[str]:
    """The JSON text of the comparisons, as ``json.dumps(body, indent=1)`` writes it, in parts:
    the body with a placeholder where each comparison's pairs go, then the pairs one at a time,
    indented as they would be in place."""
    token = f"attnbench-pairs-{secrets.token_hex(16)}-"  # no run's text can hold it
    text = json.dumps(_json_body(comps, fail_on, index, token), indent=1, allow_nan=False,
                      default=str)
    for i, c in enumerate(comps):
        mark = json.dumps(f"{token}{i}")
        at = text.index(mark)
        line = text[text.rfind("\n", 0, at) + 1:at]  # '   "pairs": '
        yield text[:at]
        text = text[at + len(mark):]
        yield from _pairs_json(c, len(line) - len(line.lstrip(" ")))
    yield text


def _pairs_json(c: Comparison, indent: int) -> Iterator[str]:
    """``c``'s pairs as a JSON list whose key sits ``indent`` spaces in (json's indent=1)."""
    p = c.pairs
    if p.empty:
        yield "[]"
        return
    inner = "\n" + " " * (indent + 1)
    yield "["
    separator = ""
    for start in range(0, len(p), PAIRS_CHUNK):
        for r in c.named(p.iloc[start:start + PAIRS_CHUNK]).itertuples():
            item = json.dumps(_pair(r), indent=1, allow_nan=False, default=str)
            yield separator + inner + item.replace("\n", inner)
            separator = ","
    yield "\n" + " " * indent + "]"


def _json_body(comps: Sequence[Comparison], fail_on: str, index: Path | None, token: str
               ) -> dict[str, Any]:
    body = {"schema": SCHEMA, "fail_on": fail_on,
            "regressions": sum(len(c.regressions_on(fail_on)) for c in comps),
            "dashboard": str(index) if index else None, "comparisons": []}
    for i, c in enumerate(comps):
        p = c.pairs
        body["comparisons"].append({
            "a": _run(c.a), "b": _run(c.b), "threshold": c.threshold,
            "warnings": c.warnings, "differences": c.differences,
            "matched": len(p), "same_gpu_kind": int(p.same_kind.sum()) if len(p) else 0,
            "only_a": len(c.only_a), "only_b": len(c.only_b),
            "timing": {d: {str(k): int(n) for k, n in p[f"{d}_class"].value_counts().items()}
                       if len(p) else {} for d in DIRECTIONS},
            "ambiguous_why": {d: ambiguous_reasons(p, d) for d in DIRECTIONS},
            "verdicts_changed": {str(k): int(n) for k, n in
                                 p[p.verdict_changed].verdict_change.value_counts().items()}
            if len(p) else {},
            "regressions": [{**_pair(r), "what": _what(r)}
                            for r in c.regressions_on(fail_on).itertuples()],
            "pairs": f"{token}{i}",  # _json_parts writes them in its place
        })
    return body


# -- Markdown ---------------------------------------------------------------------------------

# Inside a table cell only these act: emphasis, code, links, strikethrough, backslash, and |.
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


def md(value: Any, limit: int = 300) -> str:
    """Text from a run, safe in a Markdown table cell: one line, ``&`` and ``<`` as entities
    (``<script>`` stays text; a lone ``>`` opens no tag, so ``pass -> fail`` reads as written),
    Markdown's punctuation backslash-escaped (``|`` cannot end a cell)."""
    text = printable(value, limit)
    text = text.replace("&", "&amp;").replace("<", "&lt;")
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text)


def _speed(r: Any, d: str) -> str:
    speed = getattr(r, f"{d}_speed")
    if not isinstance(speed, float) or not math.isfinite(speed) or speed <= 0:
        return ""
    return f"{(1 / speed - 1) * 100:+.1f}% time"


def comparison_markdown(comps: Sequence[Comparison], fail_on: str, index: Path | None) -> str:
    total = sum(len(c.regressions_on(fail_on)) for c in comps)
    gate = {"speed": "speed", "accuracy": "accuracy", "both": "speed and accuracy"}[fail_on]
    head = (f"### attnbench compare: {total} regression{'s' if total != 1 else ''}"
            if total else "### attnbench compare: no regressions")
    lines = [head, "", f"Gate: {gate} (`--fail-on {fail_on}`).", ""]
    for c in comps:
        p = c.pairs
        lines += [f"**A (baseline)**: {md(describe(c.a), 600)}  ",
                  f"**B**: {md(describe(c.b), 600)}", ""]
        for w in c.warnings:
            lines.append(f"> warning: {md(w)}  ")
        n_same = int(p.same_kind.sum()) if len(p) else 0
        lines += ["", f"{len(p)} matched cases ({n_same} on the same GPU kind), "
                  f"{len(c.only_a)} only in A, {len(c.only_b)} only in B; threshold "
                  f"{c.threshold:.0%}.", "",
                  "| timing | FAST | SLOW | SAME | AMBIGUOUS | ratio only | n/a |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for d in DIRECTIONS:
            counts = p[f"{d}_class"].value_counts() if len(p) else {}
            cells = [str(int(counts.get(k, 0))) for k in
                     ("FAST", "SLOW", "SAME", "AMBIGUOUS", "RATIO", "n/a")]
            lines.append(f"| {d} | " + " | ".join(cells) + " |")
        changed = p[p.verdict_changed] if len(p) else p
        if len(changed):
            lines += ["", "Verdicts changed: " + ", ".join(
                f"{n} {md(k)}" for k, n in changed.verdict_change.value_counts().items()) + "."]
        if len(p) and p.worst_err_ratio.notna().any():
            worst = worst_pair(c)
            lines += ["", f"Accuracy: error ratio B/A median {p.worst_err_ratio.median():.2f}, "
                      f"worst {worst.worst_err_ratio:.3g}x ({md(worst.label_b)})."]
        reg = c.regressions_on(fail_on)
        if len(reg):
            lines += ["", f"#### Regressions ({len(reg)})", "",
                      "| case | id | what | fwd | bwd |", "|---|---|---|---:|---:|"]
            for r in reg.head(MAX_MARKDOWN_ROWS).itertuples():
                what = ", ".join(md(w) for w in _what(r))
                lines.append(f"| {md(r.label_b)} | {md(str(r.id_b)[:10])} | {what} | "
                             f"{_speed(r, 'fwd')} | {_speed(r, 'bwd')} |")
            if len(reg) > MAX_MARKDOWN_ROWS:
                lines.append(f"\n... and {len(reg) - MAX_MARKDOWN_ROWS} more (`--format json` "
                             "or the dashboard lists all)")
        lines += _ambiguous_block(c)
        lines.append("")
    if index is not None:
        lines.append(f"Dashboard: {md(index, 1000)}")
    return "\n".join(lines).rstrip() + "\n"


def _ambiguous_block(c: Comparison) -> list[str]:
    """The AMBIGUOUS pairs and why, folded (they ask for a rerun, not a review)."""
    p = c.pairs
    if not len(p):
        return []
    amb = p[(p.fwd_class == "AMBIGUOUS") | (p.bwd_class == "AMBIGUOUS")]
    if not len(amb):
        return []
    summary = "; ".join(f"{d}: " + ", ".join(f"{n} {w}" for w, n in ambiguous_reasons(p, d).items())
                        for d in DIRECTIONS if ambiguous_reasons(p, d))
    out = ["", f"<details><summary>{len(amb)} AMBIGUOUS ({md(summary)})</summary>", "",
           "| case | fwd | bwd |", "|---|---|---|"]
    for r in c.named(amb.head(MAX_MARKDOWN_ROWS)).itertuples():
        out.append(f"| {md(r.label_b)} | {md(r.fwd_why)} | {md(r.bwd_why)} |")
    if len(amb) > MAX_MARKDOWN_ROWS:
        out.append(f"\n... and {len(amb) - MAX_MARKDOWN_ROWS} more")
    return out + ["", "</details>"]
