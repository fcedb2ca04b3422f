"""Parity: a CP/TP result against the same backend at CP = 1, TP = 1 on the same inputs.

Seed 001 is this check's reason to exist: a TP = 2 dQ that disagreed with TP = 1 by 0.5 (and
both with the reference by 1.1). Splitting a problem changes only the order of sums and where
partial results are rounded, so a correct parallel result differs from the single-device one by
about as much as either differs from the exact answer.

The bound is the baseline-ratio rule of :mod:`attnbench.accuracy.bounds`, with the single-device run
of the same backend as the baseline:

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

import torch

from attnbench.accuracy.bounds import (RATIO_FACTOR, RATIO_FLOOR, Check, split_sum_roundings,
                                       tensor_errors)
from attnbench.parallel.layout import Shard
from attnbench.problem.reference import reference_backward
from attnbench.results.records import TENSORS

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
    for name in (t for t in TENSORS if t in parallel):  # out alone: a forward-only case
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


def summed_partials(case, summed_over_cp: bool) -> int:
    """How many ranks' rounded dK/dV partials the split adds up per element: MQA's replicated
    K/V head over TP, every CP rank's under all-gather CP (ring CP sums in float32 blocks that
    the backend did not round: judged otherwise, see runner.evaluate_parallel)."""
    return (case.cp if summed_over_cp else 1) * (case.tp if case.heads_kv == 1 else 1)


def reference_roundings(case, q, k, v, dout, out64, lse64, spec, keep_mask, ref: dict,
                        parts: int) -> dict:
    """tensor -> (factor, note) for the ``reference`` backend's dK/dV under a split that sums
    ``parts`` rounded partials (:func:`attnbench.accuracy.bounds.split_sum_roundings`). Rank r's
    exact partial is the fp64 backward with dout zero outside r's queries (its heads and positions):
    dK and dV are sums over queries, and a query with dout = 0 adds nothing to either."""
    if parts <= 1:
        return {}
    abs_sum = {"dk": torch.zeros_like(ref["dk"]), "dv": torch.zeros_like(ref["dv"])}
    for rank in range(case.world_size):
        theirs = Shard.of(case, *divmod(rank, case.tp))
        dout_r = torch.zeros_like(dout)
        theirs.place_q(dout_r, theirs.slice_q(dout))
        _, dk_r, dv_r = reference_backward(q, k, v, out64, lse64, dout_r, spec,
                                           keep_mask=keep_mask)
        abs_sum["dk"] += dk_r.abs()
        abs_sum["dv"] += dv_r.abs()
    found = {}
    for name, total in abs_sum.items():
        factor = split_sum_roundings(case.dtype, parts, total.norm().item(),
                                     ref[name].norm().item())
        found[name] = (factor, f"fp64 rounded on each of {parts} ranks, summed, rounded again: "
                               f"{factor:.3g} x the unit roundoff")
    return found
