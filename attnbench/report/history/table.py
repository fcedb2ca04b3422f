"""A history as text (a table per GPU kind, stdout) and as JSON (every case, for tools).

Text: the runs (``r1`` .. ``rN`` in history order, with commit, its date and the run's start),
then per GPU kind its steps, worst first, and a table of the cases with a step (``--all``:
every case): a line per metric, a value per run, the value where a step appeared marked ``^``
(up: slower, a larger error) or ``v`` (down). Values from files are made printable
(:func:`~attnbench.errors.printable`); JSON holds them as they are (JSON escapes).
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any, Sequence, TextIO

from attnbench.errors import printable
from attnbench.report.history.collect import HistoryRun
from attnbench.report.history.series import METRICS, UNITS, CaseHistory, FoundStep, GpuHistory

MAX_STEPS_LISTED = 40  # steps printed per GPU kind; JSON and the page list all
MAX_CASES_LISTED = 40  # cases in a GPU kind's table without --all
COLUMN = 9  # characters of one run's value: "^12.35" and a gap
LABEL = 26  # characters before the first value: the indent and the metric's name


def when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M") if moment else "?"


def run_names(history: GpuHistory, runs: Sequence[HistoryRun]) -> list[str]:
    """``r3``: each run of ``history`` by its place among all the runs of the output."""
    place = {id(r): i + 1 for i, r in enumerate(runs)}
    return [f"r{place[id(r)]}" for r in history.runs]


def code_text(step: FoundStep, backend: str) -> str:
    if step.code is None:
        return f"{backend} code: not recorded"
    if not step.code:
        return f"{backend} code unchanged"
    return f"{backend} code changed: {'; '.join(step.code)}"


def commit_text(before: HistoryRun, after: HistoryRun) -> str:
    if not before.commit or not after.commit:
        return "commit ?"
    if before.commit == after.commit:
        return f"same commit {after.commit[:12]}"
    return f"commit {before.commit[:12]} -> {after.commit[:12]}"


def step_line(case: CaseHistory, step: FoundStep, history: GpuHistory,
              names: Sequence[str]) -> str:
    """``fwd +30.1% at r4 (after r3; commit a -> b; triton code changed: ...): label``."""
    s = step.step
    change = f"{(s.ratio - 1) * 100:+.1f}%" if math.isfinite(s.ratio) else "from 0"
    before, after = history.runs[step.before], history.runs[step.run]
    return (f"{step.metric:<5} {change:>8} at {names[step.run]} ({after.run_id}; after "
            f"{names[step.before]}; {commit_text(before, after)}; "
            f"{code_text(step, case.backend)}): {case.label}")


def by_run(history: GpuHistory, names: Sequence[str]) -> list[str]:
    """``at r4 (run-id): 54 steps (54 up); triton: 54, code changed``: where steps gathered,
    and the backends whose cases stepped there (a new level of many cases at one run is one
    event: an edit, a driver, a machine)."""
    runs: dict[int, dict[str, list[FoundStep]]] = {}
    for case, step in history.steps:
        runs.setdefault(step.run, {}).setdefault(case.backend, []).append(step)
    lines = []
    for at in sorted(runs):
        steps = [s for found in runs[at].values() for s in found]
        up = sum(s.rise for s in steps)
        backends = "; ".join(
            f"{backend}: {len(found)}, "
            + ("code changed" if any(s.code for s in found) else
               "code unchanged" if all(s.code == [] for s in found) else "code not recorded")
            for backend, found in sorted(runs[at].items()))
        lines.append(f"  at {names[at]} ({history.runs[at].run_id}): {len(steps)} steps ({up} up, "
                     f"{len(steps) - up} down); {backends}")
    return lines


def _cell(value: float, mark: str) -> str:
    text = "-" if not math.isfinite(value) else f"{value:.4g}"
    return f"{mark}{text}".rjust(COLUMN)


def case_lines(case: CaseHistory) -> list[str]:
    lines = [f"    {case.label}"]
    for metric in METRICS:
        values = case.values[metric]
        if not any(math.isfinite(v) for v in values):
            continue
        marks = {s.run: "^" if s.rise else "v" for s in case.steps if s.metric == metric}
        lines.append(f"      {UNITS[metric]:<{LABEL - 6}}"
                     + "".join(_cell(v, marks.get(j, "")) for j, v in enumerate(values)))
    return lines


def history_text(histories: Sequence[GpuHistory], runs: Sequence[HistoryRun], order: str,
                 every_case: bool = False) -> str:
    lines = [f"attnbench history: {len(runs)} runs, in {order} order"]
    for i, r in enumerate(runs):
        commit = (r.commit or "?")[:12] + (" (dirty)" if r.dirty else "")
        lines.append(f"  r{i + 1:<3} {r.run_id}  commit {commit} of {when(r.commit_date)}; "
                     f"began {when(r.created)}")
    for h in histories:
        names = run_names(h, runs)
        steps = sorted(h.steps, key=lambda cs: -abs(math.log(cs[1].step.ratio))
                       if 0 < cs[1].step.ratio < math.inf else -math.inf)
        up = sum(s.rise for _, s in steps)
        lines += ["", f"{h.gpu}: {len(h.runs)} runs ({', '.join(names)}), {len(h.cases)} cases, "
                      f"{len(steps)} steps ({up} up, {len(steps) - up} down)"]
        lines += by_run(h, names)
        for case, step in steps[:MAX_STEPS_LISTED]:
            lines.append("  " + step_line(case, step, h, names))
        if len(steps) > MAX_STEPS_LISTED:
            lines.append(f"  ... and {len(steps) - MAX_STEPS_LISTED} more (--format json or "
                         "--out DIR lists all)")
        shown = h.cases if every_case else [c for c in h.cases if c.steps]
        if shown:
            title = "every case:" if every_case else "cases with a step:"
            lines.append(f"  {title:<{LABEL - 2}}" + "".join(n.rjust(COLUMN) for n in names))
        limit = len(shown) if every_case else MAX_CASES_LISTED
        for case in shown[:limit]:
            lines += case_lines(case)
        if len(shown) > limit:
            lines.append(f"    ... and {len(shown) - limit} more cases with a step (--all)")
    return "\n".join(printable(line) for line in lines) + "\n"


def _number(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _moment(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def history_json(histories: Sequence[GpuHistory], runs: Sequence[HistoryRun], order: str,
                 stream: TextIO, page: str | None = None) -> None:
    """Every run, every GPU kind's cases with their values per run and their steps; ``page``:
    the HTML page written, if any."""
    index = {id(r): i for i, r in enumerate(runs)}
    out: dict[str, Any] = {
        "order": order, "page": page,
        "runs": [{"run_id": r.run_id, "path": str(r.run.path), "commit": r.commit,
                  "commit_date": _moment(r.commit_date), "created": _moment(r.created),
                  "dirty": r.dirty} for r in runs],
        "histories": []}
    for h in histories:
        at = [index[id(r)] for r in h.runs]
        cases = []
        for c in h.cases:
            steps = [{"metric": s.metric, "run": at[s.run], "run_id": h.runs[s.run].run_id,
                      "previous_run": at[s.before], "before": _number(s.step.before),
                      "after": _number(s.step.after), "ratio": _number(s.step.ratio),
                      "code_changed": None if s.code is None else bool(s.code),
                      "code": s.code} for s in c.steps]
            cases.append({"label": c.label, "backend": c.backend, "verdicts": c.verdicts,
                          "values": {m: [_number(v) for v in c.values[m]] for m in METRICS},
                          "steps": steps})
        out["histories"].append({"gpu": h.gpu, "runs": at, "cases": cases})
    json.dump(out, stream, allow_nan=False)
    stream.write("\n")
