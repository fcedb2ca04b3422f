"""One look for every figure and page: verdict colours, backend colours, figure defaults.

The verdict colours are the same in the heatmap, the verdict matrix, the table badges and the
compare page, so a colour means one thing everywhere: pass green, timed (accuracy not checked)
steel blue -- never green --, fail red, error dark red, crash purple, timeout orange, oom brown,
unsupported / skipped grey, lost slate. "timed" is shown as "not judged" (:func:`verdict_label`):
its accuracy was not checked, so it is neither a pass nor a failure.
"""

from __future__ import annotations

from typing import Iterable

from attnbench.results.records import SEVERITY, VERDICTS

VERDICT_COLORS: dict[str, str] = {
    "pass": "#2e9e4f",
    "timed": "#6a8fb3",
    "fail": "#d62728",
    "error": "#8b1a1a",
    "crash": "#6a2c91",
    "timeout": "#f28e1c",
    "oom": "#8c564b",
    "unsupported": "#9e9e9e",
    "skipped": "#c4c4c4",
    "lost": "#37474f",
}
assert set(VERDICT_COLORS) == set(VERDICTS), "every verdict needs a colour"

# What a reader sees for a verdict whose name alone would mislead: a "timed" case ran with
# `accuracy: false` (only NaN/Inf checked), so the page says what was not done.
VERDICT_LABELS: dict[str, str] = {"timed": "not judged"}
VERDICT_TITLES: dict[str, str] = {
    "timed": "timed only (accuracy: false): NaN/Inf checked, accuracy not judged",
}
NOISY_TITLE = "the timing's spread never settled (timing.*.noisy): read this number with care"

# Comparison classes (compare.py) share the palette: slower is red, faster green.
CLASS_COLORS: dict[str, str] = {
    "FAST": "#2e9e4f",
    "SLOW": "#d62728",
    "SAME": "#9e9e9e",
    "AMBIGUOUS": "#f2b01c",
    "RATIO": "#1f77b4",   # different GPU kinds: a ratio, never a verdict
    "n/a": "#dddddd",
}

# Series colours avoid the verdict hues (green, red, orange, brown, purple, grey), so a line is
# never read as a verdict.
BACKEND_PALETTE = ("#1f77b4", "#e377c2", "#17becf", "#9a9b1c", "#393b79", "#c9a227",
                   "#8c8cd9", "#2a6f97", "#b5679e", "#5c6b2f")
# ... and a marker each (matplotlib's name, bokeh's), since some of those colours look alike on
# a thin line (olive and gold, navy and blue); 7 markers against 10 colours: the first 70
# series of a page differ in the pair.
SERIES_MARKERS = (("o", "circle"), ("s", "square"), ("^", "triangle"), ("D", "diamond"),
                  ("v", "inverted_triangle"), ("h", "hex"), ("*", "star"))
SERIES_LINESTYLES = ("-", "-.", ":")  # a series past the palette's ten colours: the next style

RC = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.6,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "svg.fonttype": "none",      # text stays text in SVG: smaller, searchable
    "svg.hashsalt": "attnbench",  # stable ids, so regenerated SVGs diff cleanly
    # FreeType's autohinter (matplotlib's default) analyses every glyph it draws and is about a
    # quarter of the PNG time of a text-heavy figure (the heatmap); unhinted text at 120 dpi
    # reads the same.
    "text.hinting": "no_hinting",
}


def worst(verdicts: Iterable[str]) -> str:
    present = set(verdicts)
    for v in SEVERITY:
        if v in present:
            return v
    return "pass"


def verdict_label(verdict: str) -> str:
    """The verdict as pages and figures show it ("timed" -> "not judged")."""
    return VERDICT_LABELS.get(verdict, verdict)


def fmt_bytes(n: float | None) -> str:
    """Bytes as "1.25 GiB", "340 MiB", "12 KiB"; "" for unknown (None, NaN)."""
    if n is None or n != n or n < 0:
        return ""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


def backend_colors(backends: Iterable[str]) -> dict[str, str]:
    """A stable backend -> colour map (sorted names, so every panel of a page agrees)."""
    names = sorted(set(backends))
    return {name: BACKEND_PALETTE[i % len(BACKEND_PALETTE)] for i, name in enumerate(names)}


def text_color_on(hex_color: str) -> str:
    """Black or white, whichever reads better on ``hex_color`` (WCAG relative luminance)."""
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) / 255 for i in (0, 2, 4))

    def lin(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    lum = 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)
    return "#000000" if lum > 0.25 else "#ffffff"
