"""Parity: a CP/TP result against the same backend at CP = 1, TP = 1 on the same inputs.

Seed 001 is this check's reason to exist: a TP = 2 dQ that disagreed with TP = 1 by 0.5 (and
both with the reference by 1.1). Splitting a problem changes only the order of sums and where
partial results are rounded, so a correct parallel result differs from the single-device one by
about as much as either differs from the exact answer.

The bound is the baseline-ratio rule of :mod:`attnbench.accuracy`, with the single-device run of
the same backend as the baseline:

    rel_l2(parallel, single) <= PARITY_FACTOR * rel_l2(single, fp64) + PARITY_FLOOR[dtype]

Measured with ``python benchmarks/cp_overhead.py`` on the cp_tp sweep (naive, fp32 / bf16,
ring / zigzag / allgather, cp 2-4, tp 1-2, 110 multi-rank cases): parity / bound was at most
0.39 (bf16 zigzag dv; parity 5.9e-3 against a bound of ~1.5e-2), 0.23 in fp32 (parity <= 3.8e-7);
TP alone and all-gather's out/dq are bit-identical to the single run. Seed 001's 0.5 is ~30x over
the bf16 bound. A result
that uses other dropout masks than the single-device run is not comparable (a backend that does
not expose its mask draws it from an RNG whose state depends on the split): the values are kept
with ``bound: null`` and the identities decide.
"""

from __future__ import annotations

import math
from typing import Optional

from attnbench.accuracy import RATIO_FACTOR, RATIO_FLOOR, Check, tensor_errors
from attnbench.records import TENSORS

PARITY_FACTOR = RATIO_FACTOR
"""Same as the baseline ratio (flash-attn's 2): the split may lose at most twice the single run's
own error."""

PARITY_FLOOR = RATIO_FLOOR
"""About one unit roundoff per dtype (fp32 more: a different summation order over S keys costs
~sqrt(S) roundoffs); keeps the bound meaningful where the single run is nearly exact."""


def parity(parallel: dict, single: dict, single_errors: Optional[dict],
           dtype: str) -> tuple[list[Check], dict]:
    """Checks and the ``accuracy["parity"]`` table ({tensor: {"rel_l2", "bound"}}).
    ``parallel`` / ``single``: tensor name -> full tensor; ``single_errors``: tensor -> rel_l2 of
    the single run against fp64, or None when the two runs are not comparable (no checks are made
    then, the values are kept with ``bound: None``)."""
    checks, table = [], {}
    for name in TENSORS:
        value = tensor_errors(parallel[name], single[name])["rel_l2"]
        finite = math.isfinite(value)
        base = None if single_errors is None else single_errors[name]
        if base is None or not math.isfinite(base):
            # Not comparable, or the single run has NaN/Inf (its own record says so): no bound.
            table[name] = {"rel_l2": value if finite else None, "bound": None}
            continue
        bound = PARITY_FACTOR * base + PARITY_FLOOR[dtype]
        why = (f"vs same backend at cp=1 tp=1: {PARITY_FACTOR:g} x its error {base:.3g} + "
               f"{PARITY_FLOOR[dtype]:g}")
        checks.append(Check("parity", name, "rel_l2", value, bound, finite and value <= bound,
                            why))
        table[name] = {"rel_l2": value if finite else None, "bound": bound}
    return checks, table
