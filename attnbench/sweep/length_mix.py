"""Reproducible mixes of document lengths for packed (variable-length) cases.

A sweep may write, instead of an explicit ``seqlens_q`` list::

    varlen: {lengths: lognormal, mean: 2048, max: 16384, total: 65536, seed: 0}
    varlen: {lengths: uniform, min: 16, max: 300, total: 1000, seed: 3}

:func:`expand` turns it into the explicit list when the sweep is validated, so the case id is a
hash of the lengths themselves and the record carries them. Lengths are drawn one after another
until ``total`` tokens are used; the last document takes what is left (it may be shorter than
``min``: a short tail is also what a packer leaves). Only Python's seeded ``random.random`` is
used (its sequence is fixed across Python versions), never numpy or torch: reading a sweep
imports neither.
"""

from __future__ import annotations

import math
import random
from typing import Any, Mapping

from attnbench.errors import SweepError
from attnbench.validation import Choice, Int, Real, fail

DISTRIBUTIONS = ("lognormal", "uniform")
MAX_SIGMA = 4.0
"""Log-space spread of lognormal lengths: sigma 4 already puts 1 in 20 draws at 700x the
median; a larger one only produces lengths clipped to ``min`` or ``max``."""
PARAMETERS = {"lognormal": ("lengths", "mean", "sigma", "min", "max", "total", "seed"),
         "uniform": ("lengths", "min", "max", "total", "seed")}


def expand(where: str, value: Any, max_count: int, max_total: int) -> tuple[int, ...]:
    """The explicit lengths a ``varlen`` generator stands for; :class:`SweepError` (one line
    naming the parameter) for anything out of range, or a mix of more than ``max_count``
    documents."""
    if not isinstance(value, Mapping) or "lengths" not in value:
        raise fail(where, value, "a mapping such as {lengths: lognormal, mean: 2048, "
                   "max: 16384, total: 65536, seed: 0}")
    kind = Choice(DISTRIBUTIONS).check(f"{where}.lengths", value["lengths"])
    for key in value:
        if key not in PARAMETERS[kind]:
            raise SweepError(f"{where}.{key}: unknown parameter for lengths: {kind}, expected "
                             f"one of {', '.join(PARAMETERS[kind])}")
    for key in ("total",) + (("mean",) if kind == "lognormal" else ("min", "max")):
        if key not in value:
            needs = "total and mean" if kind == "lognormal" else "min, max and total"
            raise SweepError(f"{where}.{key}: missing (lengths: {kind} needs {needs})")
    total = Int(1, max_total, f"a positive integer <= {max_total} (tokens in the pack)").check(
        f"{where}.total", value["total"])
    low = Int(1, total, f"an integer in [1, total={total}]").check(
        f"{where}.min", value.get("min", 1))
    high = Int(low, max_total, f"an integer in [min={low}, {max_total}]").check(
        f"{where}.max", value.get("max", total))
    seed = Int(0, 2**63 - 1).check(f"{where}.seed", value.get("seed", 0))
    rng = random.Random(seed)
    if kind == "lognormal":
        mean = Real(low, high, expected=f"a number in [min={low}, max={high}]").check(
            f"{where}.mean", value["mean"])
        sigma = Real(0.0, MAX_SIGMA, lo_open=True).check(f"{where}.sigma",
                                                         value.get("sigma", 1.0))
        mu = math.log(mean) - sigma * sigma / 2  # so that E[length] = mean before clipping
        draw = lambda: math.exp(mu + sigma * _standard_normal(rng))  # noqa: E731
    else:
        draw = lambda: low + rng.random() * (high - low + 1)  # noqa: E731
    lengths: list[int] = []
    left = total
    while left > 0:
        if len(lengths) == max_count:
            raise SweepError(f"{where}: makes more than {max_count} sequences of {total} tokens; "
                             "expected at most that many (raise mean or min, or lower total)")
        n = min(high, max(low, int(draw())), left)
        lengths.append(n)
        left -= n
    return tuple(lengths)


def _standard_normal(rng: random.Random) -> float:
    """Box-Muller from two ``rng.random()`` draws (``random.gauss`` keeps hidden state)."""
    u1 = 1.0 - rng.random()  # in (0, 1]: log is finite
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * rng.random())
