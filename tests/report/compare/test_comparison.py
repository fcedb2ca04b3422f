"""The order of a gate's regressions (``Comparison.regressions_on``): verdict regressions first,
the largest error ratio B/A among them first -- an accuracy gate's reader wants the worst error,
not the slowest case -- then the largest slowdown."""

from __future__ import annotations

import pandas as pd

from attnbench.report.compare.comparison import Comparison


def _comparison(rows: list[dict]) -> Comparison:
    pairs = pd.DataFrame([{"row_a": i, "row_b": i, "same_kind": True, "fwd_class": "SAME",
                           "bwd_class": "SAME", "fwd_speed": 1.0, "bwd_speed": 1.0,
                           "verdict_regression": False, "worst_err_ratio": 1.0, **r}
                          for i, r in enumerate(rows)])
    names = pd.DataFrame({"label": [r["name"] for r in rows]})
    return Comparison(a=None, b=None, threshold=0.05, pairs=pairs, only_a=pairs.iloc[:0],
                      only_b=pairs.iloc[:0], names_a=names, names_b=names)


def test_verdict_regressions_by_error_then_slowdowns_by_speed():
    comp = _comparison([
        {"name": "slow 2x", "fwd_class": "SLOW", "fwd_speed": 0.5},
        {"name": "error 3x", "verdict_regression": True, "worst_err_ratio": 3.0,
         "fwd_speed": 0.05},  # the slowest: ordered by time it would lead
        {"name": "slow 4x", "fwd_class": "SLOW", "fwd_speed": 0.25},
        {"name": "error 900x", "verdict_regression": True, "worst_err_ratio": 900.0,
         "fwd_speed": 0.1},
        {"name": "error unknown", "verdict_regression": True, "worst_err_ratio": float("nan")},
    ])
    assert list(comp.regressions_on("both").label_b) == [
        "error 900x", "error 3x", "error unknown", "slow 4x", "slow 2x"]
    assert list(comp.regressions_on("accuracy").label_b) == [
        "error 900x", "error 3x", "error unknown"]
    assert list(comp.regressions_on("speed").label_b) == ["slow 4x", "slow 2x"]
