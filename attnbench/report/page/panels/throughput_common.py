"""What the throughput panel's line plots and bar charts share: per-group statistics, facet
keys, which facets make a bar chart's rows, and the percent-of-peak axis."""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np
import pandas as pd


def throughput_stats(s: pd.DataFrame, d: str, unit_scale: float, by) -> pd.DataFrame:
    """Per value of ``by`` (column name or names): the median throughput ``t`` and its q1..q3
    range ``lo``..``hi`` (medians over the cases, in the panel's unit), the number of cases
    ``n``, the fewest timing samples of one of them, ``samples``, and whether any of their
    timings is ``noisy`` (its spread never settled)."""
    s = s[s[f"{d}_tflops"].notna()]
    tfl = s[f"{d}_tflops"] * unit_scale
    med = s[f"{d}_median_ms"]
    keys = [by] if isinstance(by, str) else list(by)
    t = pd.DataFrame({"t": tfl, "lo": tfl * med / s[f"{d}_q3_ms"],  # slower quartile -> lower
                      "hi": tfl * med / s[f"{d}_q1_ms"], "samples": s[f"{d}_n"],
                      "noisy": s[f"{d}_noisy"].astype(bool),
                      **{f"_k{i}": s[k] for i, k in enumerate(keys)}})
    agg = t.groupby([f"_k{i}" for i in range(len(keys))]).agg(
        t=("t", "median"), lo=("lo", "median"), hi=("hi", "median"), n=("t", "size"),
        samples=("samples", "min"), noisy=("noisy", "any"))
    agg.index.names = keys
    return agg


def facet_key(values: Iterable[Any]) -> tuple[str, ...]:
    return tuple("?" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)
                 for v in values)


def bar_rows(facets: list[str]) -> list[str]:
    """The facets that make the rows of a bar chart (the others make one chart each)."""
    return ["features"] if "features" in facets else facets[-1:]


def peak_axis(ax, sub: pd.DataFrame, d: str, unit_scale: float, axis: str = "y") -> None:
    """A second axis in percent of peak (right of a y axis, above an x axis), when every
    point's peak is the same device peak."""
    rows = sub[sub[f"{d}_tflops"].notna()]
    pct = rows[f"{d}_pct_peak"]
    if rows.empty or pct.isna().any() or (pct <= 0).any():
        return
    peaks = rows[f"{d}_tflops"] / (pct / 100.0)
    peak = float(peaks.median())
    if not np.allclose(peaks, peak, rtol=0.02):
        return  # several devices or dtypes with different peaks share this axis: no single %
    peak *= unit_scale
    functions = (lambda t: t / peak * 100.0, lambda p: p * peak / 100.0)
    if axis == "x":
        sec = ax.secondary_xaxis("top", functions=functions)
        sec.set_xlabel("% of peak")
        ax.spines["top"].set_visible(True)
        return
    sec = ax.secondary_yaxis("right", functions=functions)
    sec.set_ylabel("% of peak")
    ax.spines["right"].set_visible(True)
