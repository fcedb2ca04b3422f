"""``attnbench show --all`` gives every judged case its tensor closest to the bound, passing
cases too (issue 27: no error/bound column for a pass)."""

from __future__ import annotations

from attnbench.report.show.case_lines import case_lines, error_text


def _record(verdict: str, tensors: dict) -> dict:
    return {"id": "0123456789ab", "label": "flex bf16 s128", "verdict": verdict, "reason": "",
            "timing": None, "accuracy": {"tensors": tensors}}


def test_a_passing_case_shows_its_worst_error_against_its_bound():
    rec = _record("pass", {"out": {"rel_l2": 1.9e-3, "bound": 4.1e-3},
                           "dq": {"rel_l2": 3.0e-3, "bound": 4.0e-3},
                           "dk": {"rel_l2": None, "bound": 4.0e-3}})
    (line,) = case_lines([rec])
    assert line.endswith("| error 0.75 of bound (dq 0.003 / 0.004)"), line


def test_no_judged_tensor_no_column():
    assert error_text(_record("timed", {})) == ""
    assert error_text({"accuracy": None}) == ""
    assert error_text(_record("pass", {"out": {"rel_l2": 0.1, "bound": 0.0}})) == ""
