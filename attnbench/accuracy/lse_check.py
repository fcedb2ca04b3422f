"""The ``lse`` check: a returned log-sum-exp against the fp64 reference's.

Whenever a backend returns ``Forward.lse`` (dense, packed, decode, and the gathered lse of a
CP/TP run) it is compared with the reference's: the natural log of the sum of exp of the final
(scaled, capped, biased, masked) scores, per query row (docs/backends.md). A ring CP merge, a
flash-decoding combine and a backward recomputing P from it all trust this number; nothing
else shows a wrong one in a forward-only call.

Bound, per row: |lse - lse_ref| <= LSE_ROUNDINGS * u * max(1, |lse_ref|), u the unit roundoff
of the precision the scores were computed in -- the lse's own dtype (float32 at the least), or
the case's dtype where the backend declares its output computed in the input dtype (naive,
SDPA's math path: their scores are rounded to bf16 before the log-sum-exp). The lse of a row is
a p-weighted mean of its scores, so it carries about one rounding of the largest score
(|lse| >= the largest score; max(1, .) where |lse| is small next to scores of either sign), a
few more for the dot product, the scale folded in (log2 e for exp2) and the final log: 32
roundings of float32 (at |lse| ~ 5, 1e-5 absolute), 8 of a half type. The bugs sit at 0.3 or
more of |lse| (base 2, scale missing) or at whole scores apart (rows shifted).

Rows that see no key: the reference has -inf; a backend may return -inf or +inf there (both
conventions are in use, flash-attn's +inf among them), never NaN or a finite number; rows that
see a key must be finite.
"""

from __future__ import annotations

from typing import Optional

import torch

from attnbench.accuracy.bounds import Check
from attnbench.problem.fp8 import output_dtype

LSE_ROUNDINGS = {"float32": 32, "half": 8}
"""Roundings of the scores' precision a correct lse may carry (see the module docstring)."""

FLOOR_DTYPE = torch.float32
"""An lse wider than float32 (float64) is judged as a float32 one: the contract's dtype."""


def scores_dtype(lse: torch.Tensor, case_dtype: str, in_input_precision: bool) -> torch.dtype:
    """The precision whose roundoff bounds ``lse``: its own dtype (float32 at the least), or
    the case's output dtype when the backend computes its output in the input dtype."""
    dtype = lse.dtype if torch.finfo(lse.dtype).eps > torch.finfo(FLOOR_DTYPE).eps \
        else FLOOR_DTYPE
    if in_input_precision:
        case = output_dtype(case_dtype)
        if torch.finfo(case).eps > torch.finfo(dtype).eps:
            dtype = case
    return dtype


def lse_bound(dtype: torch.dtype) -> float:
    """LSE_ROUNDINGS x the unit roundoff of ``dtype`` (relative to max(1, |lse_ref|))."""
    return _roundings(dtype) * torch.finfo(dtype).eps / 2


def _roundings(dtype: torch.dtype) -> int:
    return LSE_ROUNDINGS["float32" if dtype == torch.float32 else "half"]


def lse_checks(lse: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype
               ) -> tuple[list[Check], dict]:
    """(the ``lse`` checks, the record's ``accuracy.lse`` section) of a returned ``lse``
    against the fp64 reference ``ref`` (same shape), bounded in ``dtype``'s roundoff
    (:func:`scores_dtype`)."""
    got = lse.detach().to(torch.float64)
    ref = ref.detach().to(device=got.device, dtype=torch.float64)
    no_key = torch.isneginf(ref)
    seen = ~no_key
    bound = lse_bound(dtype)
    # rows that see a key: finite, within the bound
    bad_seen = seen & ~torch.isfinite(got)
    scaled = ((got - ref).abs() / ref.abs().clamp_min(1.0))[seen & torch.isfinite(got)]
    worst = float(scaled.max()) if scaled.numel() else 0.0
    abs_err = (got - ref).abs()[seen & torch.isfinite(got)]
    # rows that see no key: -inf or +inf, whichever convention
    bad_empty = no_key & ~torch.isinf(got)
    checks = [Check("lse", "lse", "max |lse - ref| / max(1, |ref|)", worst, bound,
                    worst <= bound, f"{_roundings(dtype)} roundings of {_label(dtype)}")]
    if bad_seen.any():
        checks.append(Check("lse", "lse", "non-finite rows that see a key",
                            float(bad_seen.sum()), 0.0, False))
    if bad_empty.any():
        checks.append(Check("lse", "lse", "rows that see no key not +-inf",
                            float(bad_empty.sum()), 0.0, False,
                            "expected -inf (or +inf) where no key is visible"))
    section = {"max_abs": float(abs_err.max()) if abs_err.numel() else 0.0,
               "max_scaled": worst, "bound": bound, "dtype": _label(lse.dtype),
               "rows_no_key": int(no_key.sum()),
               "no_key_as": _convention(got[no_key])}
    return checks, section


def _label(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _convention(values: torch.Tensor) -> Optional[str]:
    """How the backend writes a row that sees no key: "-inf", "+inf", "mixed" or None."""
    if not values.numel():
        return None
    neg, pos = bool(torch.isneginf(values).all()), bool(torch.isposinf(values).all())
    return "-inf" if neg else "+inf" if pos else "mixed"
