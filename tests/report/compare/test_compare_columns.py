"""``compare`` classifies every pair at once
(:func:`attnbench.report.compare.gate.timing_columns`,
issue 29: a Python loop over 10^6 pairs cost ~20 s); :func:`classify` is the rule, one pair at
a time. Both must agree on every pair, including the edges: missing, zero and negative times,
intervals exactly at the threshold, noisy flags (missing ones read True, as ``bool()`` reads
NaN), pairs across GPU kinds."""

import math
import random

import numpy as np
import pandas as pd
import pytest

from attnbench.report.compare.gate import classify, timing_columns
from attnbench.report.read.doubt import why_ambiguous

STATS = ("median_ms", "min_ms", "q1_ms", "q3_ms", "n")
EDGES = (math.nan, 0.0, -1.0, math.inf, 1.0, 1.05, 1.1, 1.0 * 1.05, 2.0)
"""Values a side's statistics take here besides random ones: missing, zero, negative,
infinite, and those that land exactly on a threshold of 5% (1.0 against 1.05)."""


def _pairs(rng: random.Random, rows: int) -> pd.DataFrame:
    def value() -> float:
        return rng.choice(EDGES) if rng.random() < 0.3 else rng.uniform(0.5, 2.0)

    data = {f"fwd_{stat}_{s}": [value() for _ in range(rows)] for stat in STATS for s in "ab"}
    for s in "ab":
        data[f"fwd_noisy_{s}"] = [rng.choice([True, False, False, math.nan]) for _ in range(rows)]
    data["same_kind"] = [rng.random() < 0.8 for _ in range(rows)]
    return pd.DataFrame(data)


def _one_at_a_time(pairs: pd.DataFrame, threshold: float) -> dict[str, list]:
    out: dict[str, list] = {k: [] for k in ("class", "speed", "noisy", "why")}
    for r in pairs.itertuples():
        sa, sb = ({"median": getattr(r, f"fwd_median_ms_{s}"), "min": getattr(r, f"fwd_min_ms_{s}"),
                   "q3": getattr(r, f"fwd_q3_ms_{s}"), "q1": getattr(r, f"fwd_q1_ms_{s}"),
                   "n": getattr(r, f"fwd_n_{s}"), "noisy": bool(getattr(r, f"fwd_noisy_{s}"))}
                  for s in "ab")
        cls = classify(sa, sb, threshold)
        if cls != "n/a" and not r.same_kind:
            cls = "RATIO"
        out["class"].append(cls)
        out["why"].append(why_ambiguous(sa, sb, threshold) if cls == "AMBIGUOUS" else "")
        out["noisy"].append(" and ".join(s for s, st in zip("AB", (sa, sb)) if st["noisy"]))
        out["speed"].append(sa["median"] / sb["median"] if cls != "n/a" else math.nan)
    return out


@pytest.mark.parametrize("threshold", [0.0, 0.05, 0.5])
def test_every_pair_classified_as_one_at_a_time(threshold):
    pairs = _pairs(random.Random(29), 3000)
    got = timing_columns(pairs, "fwd", threshold)
    want = _one_at_a_time(pairs, threshold)
    assert got["fwd_class"] == want["class"]
    assert got["fwd_why"] == want["why"]
    assert got["fwd_noisy"] == want["noisy"]
    np.testing.assert_array_equal(got["fwd_speed"], np.array(want["speed"]))
    assert {"SLOW", "FAST", "SAME", "AMBIGUOUS", "RATIO", "n/a"} <= set(got["fwd_class"])


def test_no_pairs():
    got = timing_columns(_pairs(random.Random(0), 0), "fwd", 0.05)
    assert all(len(v) == 0 for v in got.values())
