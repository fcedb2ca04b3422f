"""Judging one case's results: the one place both case runners (single- and multi-rank) use.

Given the inputs and a backend's out/dq/dk/dv, :func:`evaluate` measures errors against the
fp64 reference (when one applies), the baseline's errors on the same inputs, and the
reference-free identities, and returns a :class:`Judgement`. Further checks (determinism of
repeated backward calls, CP/TP parity) are folded in with :meth:`Judgement.merged`. Bounds and
the per-check verdict rule live in :mod:`attnbench.accuracy`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from attnbench import accuracy as acc
from attnbench.backends import get_backend
from attnbench.execution.child import is_oom
from attnbench.invariants import identity_residuals
from attnbench.records import TENSORS
from attnbench.reference import reference_backward, reference_forward

DETERMINISM_CALLS = 3
"""Backward calls compared bit for bit (the checked one and two more): a dQ summed in a random
order differs from another order in only a few bf16 elements of a small case, so one extra call
can miss it where two rarely do."""


@dataclass(frozen=True)
class Judgement:
    """What the checks of one case concluded."""

    verdict: str
    """pass | fail | timed (``accuracy: false``: only NaN/Inf were checked)."""
    reason: str
    """One line; empty for a plain pass."""
    checks: tuple[acc.Check, ...] = ()
    accuracy: Optional[dict] = None
    """The record's ``accuracy`` section (None when accuracy was off)."""

    def merged(self, checks: Sequence[acc.Check], label: str = "",
               **accuracy: Any) -> "Judgement":
        """This judgement plus more checks (and ``accuracy`` sections): a failing one makes the
        verdict ``fail`` and joins the reason, after a failure already there."""
        sections = dict(self.accuracy or {}, **accuracy)
        failed = [c for c in checks if not c.passed]
        verdict, reason = self.verdict, self.reason
        if failed:
            text = label + "; ".join(c.describe() for c in failed[:2])
            reason = f"{reason}; {text}" if reason and verdict == "fail" else text
            verdict = "fail"
        return dataclasses.replace(self, verdict=verdict, reason=reason,
                                   checks=(*self.checks, *checks), accuracy=sections)

    def record_fields(self) -> dict[str, Any]:
        return {"checks": [c.to_dict() for c in self.checks], "accuracy": self.accuracy}


def timed_only(out: torch.Tensor, grads: Sequence[torch.Tensor]) -> Judgement:
    """``accuracy: false``: no reference, no baseline -- but a NaN or Inf is still a failure."""
    checks = []
    for name, tensor in zip(TENSORS, (out, *grads)):
        count = int((~torch.isfinite(tensor)).sum().item())
        checks.append(acc.Check("nonfinite", name, "count", float(count), 0.0, count == 0))
    return Judgement("timed", "accuracy not checked (accuracy: false)").merged(checks)


def _reference(q, k, v, dout, spec, keep_mask):
    out, lse = reference_forward(q, k, v, spec, keep_mask=keep_mask)
    dq, dk, dv = reference_backward(q, k, v, out, lse, dout, spec, keep_mask=keep_mask)
    return {"out": out, "dq": dq, "dk": dk, "dv": dv, "lse": lse}


def evaluate(case, backend, spec, q, k, v, dout, out, grads) -> Judgement:
    """Errors against fp64 (when a reference applies), baseline errors and identities."""
    results = dict(zip(TENSORS, (out, *grads)))
    dropout = spec.dropout_p > 0
    keep_mask = getattr(backend, "keep_mask", None)
    errors = baseline_errors = None
    reference_cache: dict[Any, dict] = {}

    def reference_for(mask_fn):
        key = mask_fn if dropout else None  # without dropout one reference serves everyone
        if key not in reference_cache:
            reference_cache[key] = _reference(q, k, v, dout, spec, mask_fn)
        return reference_cache[key]

    if dropout and keep_mask is None:
        note = "none: the backend does not expose its dropout mask; identities decide"
    else:
        note = "exact-mask" if dropout else "exact"
        ref = reference_for(keep_mask)
        errors = {t: acc.tensor_errors(results[t], ref[t]) for t in TENSORS}
    if case.backend not in ("naive", "reference"):
        # The naive baseline on the same inputs: the error scale a backend is allowed, and how
        # ill-conditioned these inputs are in this dtype (which scales the identity bounds).
        baseline_errors = _baseline(q, k, v, dout, spec, reference_for)
    scale = acc.conditioning(errors if case.backend == "naive" else baseline_errors)

    identities = identity_residuals(q, k, v, out, dout, *grads, softcap=spec.softcap)
    bounds = acc.identity_bounds(case.dtype, scale)
    verdict, reason, checks, table = acc.judge(
        dtype=case.dtype, backend=case.backend, errors=errors, baseline=baseline_errors,
        identities=identities, softcap=spec.softcap, reference_note=note,
        identity_bound=bounds, logit_scale=_logit_scale(reference_cache))
    accuracy = {
        "reference": note,
        "tensors": table,
        "identities": {name: {"value": acc._finite_or_none(value), "bound": bounds[name]}
                       for name, value in identities.items()},
    }
    return Judgement(verdict, reason, tuple(checks), accuracy)


def _logit_scale(reference_cache: dict) -> float:
    """Largest finite |lse| of the fp64 reference (any entry: dropout does not change lse)."""
    for ref in reference_cache.values():
        lse = ref["lse"]
        finite = lse[torch.isfinite(lse)]
        return float(finite.abs().max()) if finite.numel() else 0.0
    return 0.0


def _baseline(q, k, v, dout, spec, reference_for) -> Optional[dict]:
    """Errors of the naive baseline on the same inputs, against its own exact reference."""
    naive = get_backend("naive")
    try:
        fwd = naive.forward(q, k, v, spec)
        grads = naive.backward(fwd.ctx, dout)
    except Exception as exc:
        if is_oom(exc):  # the S x S baseline may not fit where a fused kernel does
            return None
        raise
    ref = reference_for(naive.keep_mask)
    return {t: acc.tensor_errors(x, ref[t]) for t, x in zip(TENSORS, (fwd.out, *grads))}


def check_determinism(judgement: Judgement, backend, ctx, dout, grads) -> Judgement:
    """For a backend that declares ``deterministic = True``: repeated backward calls on one
    forward context must return bit-identical gradients."""
    runs = [tuple(grads)] + [tuple(backend.backward(ctx, dout))
                             for _ in range(DETERMINISM_CALLS - 1)]
    found = acc.determinism_checks(runs)
    return judgement.merged(found, determinism={c.tensor: int(c.value) for c in found})
