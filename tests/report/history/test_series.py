"""A case's values over a history's runs (attnbench.report.history.series) and how its steps
are told: the error followed for judged cases only, a case missing from a run, whether the
backend's code changed (changed, unchanged, not recorded), and text from files made printable."""

import json
import math
from pathlib import Path

from attnbench.report.history.collect import load_history
from attnbench.report.history.order import order_runs
from attnbench.report.history.series import build_histories, code_change
from attnbench.report.history.table import history_text
from attnbench.report.synthetic import write_synthetic_run

GPU = "H100-SXM5-80GB"


def _runs(root: Path, n: int, **per_run) -> list[Path]:
    paths = []
    for i in range(n):
        kw = {k: v(i) for k, v in per_run.items()}
        paths.append(write_synthetic_run(
            root / f"run{i}", gpus=(GPU,), seed=i, size="small",
            software={"commit": f"{i:x}" * 40, "commit_date": f"2026-12-0{i + 1}T00:00:00Z"},
            **kw))
    return paths


def _edit(path: Path, edit) -> None:
    journal = path / "records.jsonl"
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    for rec in records:
        edit(rec)
    journal.write_text("".join(json.dumps(r) + "\n" for r in records))


def _history(paths):
    runs, _ = order_runs(load_history(paths))
    (history,) = build_histories(runs)
    return runs, history


def test_an_error_step_in_judged_cases_only(tmp_path):
    paths = _runs(tmp_path, 5, accuracy=lambda i: i != 1)  # run1: timed only, not judged

    def worse(rec):
        if rec["case"]["backend"] == "sdpa_flash" and rec["verdict"] == "pass":
            rec["accuracy"]["tensors"]["dq"]["rel_l2"] *= 3
    for path in paths[3:]:
        _edit(path, worse)
    _, history = _history(paths)
    judged = [c for c in history.cases if c.backend == "sdpa_flash" and c.verdicts[0] == "pass"]
    assert judged
    for case in judged:
        assert math.isnan(case.values["error"][1])  # timed: no error to follow
        (step,) = [s for s in case.steps if s.metric == "error"]
        assert (step.run, step.before) == (3, 2) and step.rise and step.step.ratio > 1.5
    assert all(s.metric != "error" for c in history.cases if c.backend != "sdpa_flash"
               for s in c.steps)


def test_a_case_missing_from_a_run_is_nan_and_the_step_spans_the_gap(tmp_path):
    paths = _runs(tmp_path, 6, slowdown=lambda i: 1.0 if i < 3 else 1.4)
    _edit(paths[2], lambda rec: rec.update(verdict="lost", timing={})
          if rec["case"]["backend"] == "triton" else None)
    _, history = _history(paths)
    case = next(c for c in history.cases if c.backend == "triton" and c.verdicts[0] == "pass")
    assert math.isnan(case.values["fwd"][2]) and case.verdicts[2] == "lost"
    (step,) = [s for s in case.steps if s.metric == "fwd"]
    assert (step.run, step.before) == (3, 1)


def test_code_changed_unchanged_or_not_recorded(tmp_path):
    same = {"triton": {"module": "m", "version": "1", "source_sha256": "a" * 12}}
    paths = _runs(tmp_path / "same", 4, slowdown=lambda i: 1.0 if i < 2 else 1.5,
                  code=lambda i: same)
    runs, history = _history(paths)
    assert {tuple(s.code) for _, s in history.steps} == {()}
    assert "triton: " in (text := history_text([history], runs, "commit date"))
    assert "code unchanged" in text
    paths = _runs(tmp_path / "none", 4, slowdown=lambda i: 1.0 if i < 2 else 1.5)
    runs, history = _history(paths)
    assert {s.code for _, s in history.steps} == {None}
    assert "code not recorded" in history_text([history], runs, "commit date")
    assert code_change({"version": "1"}, {"source_sha256": "b"}) is None  # nothing shared
    assert code_change({"version": "1", "module": "m"}, {"version": "2", "module": "m"}) == [
        "version 1 -> 2"]


def test_text_from_files_is_printable(tmp_path):
    paths = _runs(tmp_path, 4, slowdown=lambda i: 1.0 if i < 2 else 1.5)
    for path in paths:
        _edit(path, lambda rec: rec.update(label="\x1b[31mred\nline"))
        manifest = json.loads((path / "manifest.json").read_text())
        (path / "manifest.json").write_text(json.dumps({**manifest,
                                                        "run_id": "id\x1b]0;title\x07"}))
    runs, history = _history(paths)
    text = history_text([history], runs, "commit date")
    assert "\x1b" not in text and "\x07" not in text and "\\x1b[31mred" in text
    assert all(line.isprintable() for line in text.splitlines())


def test_a_journal_without_labels_still_has_a_history(tmp_path):
    paths = _runs(tmp_path, 4, slowdown=lambda i: 1.0 if i < 2 else 1.5)
    for path in paths:
        _edit(path, lambda rec: rec.pop("label"))
    runs, history = _history(paths)
    assert history.steps and {c.label for c in history.cases} == {"(no label)"}
