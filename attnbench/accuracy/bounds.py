"""Error metrics, bounds and the pass/fail verdict of one case.

All bounds live in this file. The rule (flash-attn's, and attention-gym's "bound kernel error by
low-precision eager error against an FP64 measuring stick"): a backend passes a tensor when its
relative L2 error against the fp64 reference is at most a factor times the error of a baseline
in the same dtype on the same inputs, plus a small per-dtype floor that keeps the bound
meaningful when the baseline happens to be very accurate. Two baselines, chosen per tensor by
what the backend declares (``input_precision``, :mod:`attnbench.backends.capabilities`):

* **fused** (the default): :mod:`attnbench.accuracy.fused_baseline`, the precision of a
  correct fused kernel (fp32 accumulation, P rounded to the dtype before P·V), blockwise with
  O(S·D) memory, so it runs at every length the backend runs -- the same rule on every GPU. A
  kernel that loses precision it should not (a bf16 accumulator) is measured against what it
  should have kept: ``FUSED_FACTOR`` x its error + ``FUSED_FLOOR``.
* **naive**, for tensors a backend computes in the input dtype by design (naive itself, SDPA's
  math path, PyTorch's CPU flash backward for dK/dV): ``RATIO_FACTOR`` x the ``naive`` backend's
  error + ``RATIO_FLOOR``; for a gradient, the worse of naive's two correct backwards (autograd,
  and the flash-style recomputation from O and lse, whose dQ/dK are 12-15x autograd's beside an
  attention sink in bf16 and 1.0-1.4x elsewhere: ``evaluate._naive_errors``). naive materialises S x S: where it runs out of memory the tensor falls
  back to the absolute bound (only input-precision backends, which materialise as much).

A declaration chooses the bound, never what is shown: every tensor's row also carries its error
over the fused baseline's (``fused_rel_l2``, ``fused_ratio``), which the trends and findings of
:mod:`attnbench.report.read.trends` read -- a declared tensor over FUSED_FACTOR x it is a finding.
And a naive baseline off by more than naive's own absolute bound (eager ALiBi in bf16 with every
key far away: 0.13 where the fused baseline has 0.002) judges nothing: that tensor is judged
against the fused baseline (``evaluate._declared_baseline``).

The ``naive`` backend itself is held to absolute per-dtype bounds.

Where a backend does not expose its dropout mask no reference exists for it; the reference-free
identities of :mod:`attnbench.accuracy.invariants` decide, with bounds of their own.

Measured with ``python benchmarks/error_scales.py --quick --seeds 3 --backends
naive,sdpa,sdpa_flash`` (3,888 cases: fp32 / fp16 / bf16, MHA/GQA/MQA, none/causal/window,
ALiBi, dropout, softcap, normal / large_logits / outliers inputs, seqlen 64 and 203; 0 false
alarms); the comments next to each bound give the largest value seen for correct backends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

from attnbench.dtypes import BY_NAME
from attnbench.results.records import CHECKS, TENSORS

# A fused backend may lose at most this many times the fused baseline's error. Measured ratios
# of correct backends to the fused baseline (benchmarks/fused_error_ratios.py, 2,916 cases,
# seqlen 64-512, MHA/GQA/MQA, masks, ALiBi, large_logits/outliers, 3 seeds): fp32 at most
# 1.29 (triton dq) / 1.17 (sdpa out); fp16/bf16 at most 1.14 (sdpa out, dq). 2 leaves >= 1.5x.
FUSED_FACTOR = 2.0
# Added to FUSED_FACTOR * baseline: a tenth of the dtype's unit roundoff -- the fused baseline's
# own errors are ~2e-3 (bf16), ~3e-4 (fp16), ~1e-6 (fp32) relative, so the floor matters only
# where the baseline is nearly exact.
FUSED_FLOOR = {"fp32": 2.0**-24 / 10, "fp16": 2.0**-11 / 10, "bf16": 2.0**-8 / 10}

# A backend may lose at most this many times the naive baseline's error (flash-attn uses 2).
RATIO_FACTOR = 2.0

# Added to RATIO_FACTOR * baseline: about one unit roundoff of the dtype (fp32 gets more: a
# different summation order over S keys costs ~sqrt(S) roundoffs).
RATIO_FLOOR = {"fp32": 1e-6, "fp16": 5e-4, "bf16": 4e-3}

# A correct kernel may round each logit a few more times than naive does (q and k scaled before
# their product, log2 e folded into the scale for exp2), in its fp32 accumulator whatever the
# input dtype. An absolute logit error d moves P by a relative d, so each extra rounding can cost
# 2^-24 * |logit|: nothing next to fp16/bf16 rounding, but in fp32 with large logits it exceeds
# naive's own error (seen: sdpa fp32 large_logits at 2.5-2.9 x naive, |lse| ~ 40). The ratio bound
# gets LOGIT_ROUNDINGS * 2^-24 * max|lse| on top (lse of the fp64 reference: the size of the logits
# that carry the probability).
LOGIT_ROUNDINGS = 4
ACCUMULATOR_EPS = 2.0 ** -24

# Absolute relative-L2 bounds for the naive baseline (and for backends without a baseline).
# Largest seen for naive and sdpa (out / dq, dk / dv; large_logits and outliers inputs are the
# worst): fp32 1.0e-6 / 2.2e-6 / 1.1e-6; fp16 1.5e-3 / 3.1e-3 / 1.5e-3;
# bf16 1.25e-2 / 2.5e-2 / 1.3e-2. Bounds leave >= 3x headroom; the seed bugs sit near 1.
ABSOLUTE_BOUND = {
    "fp32": {"out": 5e-6, "dq": 1e-5, "dk": 1e-5, "dv": 5e-6},
    "fp16": {"out": 5e-3, "dq": 1e-2, "dk": 1e-2, "dv": 5e-3},
    "bf16": {"out": 4e-2, "dq": 8e-2, "dk": 8e-2, "dv": 4e-2},
}
# The fp64 reference through the backend protocol: exact, then rounded once to the case's dtype,
# so its error is at most the unit roundoff (2^-24, 2^-11, 2^-8); seen: about 0.4 of it.
REFERENCE_SELF_BOUND = {"fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8}


def split_sum_roundings(dtype: str, parts: int, abs_sum_norm: float, total_norm: float) -> float:
    """The reference's bound, in units of REFERENCE_SELF_BOUND, for a tensor s that a CP/TP
    split sums from ``parts`` partials p_r, each rounded to the dtype by its rank's backward
    first (dK/dV of MQA's replicated K/V under TP, of all-gather CP): s^ = fl(sum_r fl(p_r)),
    the sum in float32. Elementwise |s^ - s| <= u |s| + (u + (parts - 1) eps32) sum_r |p_r|
    (u: the dtype's roundoff, eps32: float32's), so in L2

        rel_l2 <= u (1 + (1 + (parts - 1) eps32 / u) ||sum_r |p_r| || / ||s||)

    ``abs_sum_norm`` = ||sum_r |p_r| ||, measured in fp64: partials that cancel cost more than
    independent ones (~sqrt(parts) ||s||), so the ratio is measured, not assumed."""
    if total_norm <= 0:
        return 1.0
    per_partial = 1.0 + (parts - 1) * ACCUMULATOR_EPS / REFERENCE_SELF_BOUND[dtype]
    return 1.0 + per_partial * abs_sum_norm / total_norm

# Identity residuals (normalised to read like relative errors, see invariants.py), per identity.
# Largest seen for correct backends (dv_v / dq_q / dk_sum): fp32 7e-7 / 6e-7 / 1.05e-5 (an
# attention sink: naive's dk_sum is 7.6e-6 on one device, 1.05e-5 under zigzag CP; 2.3e-6 before),
# fp16 7.6e-4 / 9.5e-4 / 1.4e-3, bf16 6.8e-3 / 1.1e-2 / 1.0e-2 (dq_q's worst: MQA with
# outlier channels, where the baseline-scaled bound below applies; tightest margin 1.3x).
# What they catch (bf16, seqlen 64-1024, measured by benchmarks/error_scales.py --bugs): a
# backward replaying another dropout mask gives dv_v 0.015-0.21; dQ scaled by 1.05 gives
# dq_q 0.013-0.08; stale softmax statistics give dk_sum ~0.1-1.
# On ill-conditioned inputs (large logits, outliers) every tensor carries more rounding, and so
# do the identities; their bound grows with the naive baseline's largest error on the same
# inputs: max(IDENTITY_BOUND, IDENTITY_BASELINE_FACTOR * baseline error). Residual / baseline
# error seen for correct backends: up to 1.2 (bf16, outliers). And with the baselines' own
# residual on the same inputs, IDENTITY_BASELINE_FACTOR * it: beside an attention sink a correct
# flash-style backward (delta = rowsum(dO * O) from the rounded O) leaves dk_sum 0.04-0.25 in
# bf16 (autograd 0.007; benchmarks/sink_baselines.py); elsewhere the term stays under the
# fixed bound but for large_logits (flash-style dk_sum 0.023: bound 0.03 -> 0.047).
IDENTITY_BASELINE_FACTOR = 2.0
IDENTITY_BOUND = {
    "fp32": {"dv_v": 2e-6, "dq_q": 2e-6, "dk_sum": 2.4e-5},
    "fp16": {"dv_v": 2e-3, "dq_q": 3e-3, "dk_sum": 4e-3},
    "bf16": {"dv_v": 1.2e-2, "dq_q": 1.2e-2, "dk_sum": 3e-2},
}


def bound_dtype(dtype: str) -> str:
    """The dtype whose bounds a case's dtype is held to (:attr:`attnbench.dtypes.Dtype.bound`:
    an fp8 case's output dtype's)."""
    return BY_NAME[dtype].bound


@dataclass
class Check:
    check: str       # one of attnbench.results.records.CHECKS
    tensor: str      # out/dq/dk/dv, or the identity's name
    metric: str
    value: Optional[float]
    bound: Optional[float]
    passed: bool
    note: str = ""

    def __post_init__(self):
        if self.check not in CHECKS:  # a misspelt name would pass every reader's test unseen
            raise ValueError(f"check {self.check!r}: expected one of {', '.join(CHECKS)}")

    def to_dict(self) -> dict:
        return {"check": self.check, "tensor": self.tensor, "metric": self.metric,
                "value": _finite_or_none(self.value), "bound": _finite_or_none(self.bound),
                "passed": self.passed, **({"note": self.note} if self.note else {})}

    def describe(self) -> str:
        if self.check == "nonfinite":
            return f"{self.tensor} has {int(self.value or 0)} NaN/Inf values"
        if self.check == "determinism":
            return (f"{self.tensor} not deterministic: {int(self.value or 0)} elements differ "
                    f"between backward calls on the same inputs ({self.note})")
        value = "n/a" if self.value is None or not math.isfinite(self.value) else f"{self.value:.3g}"
        text = f"{self.tensor} {self.metric} {value} > bound {self.bound:.3g}"
        return text + (f" ({self.note})" if self.note else "")


def _finite_or_none(x: Optional[float]) -> Optional[float]:
    # JSON has no Infinity/NaN; the nonfinite count carries that information.
    return x if x is not None and math.isfinite(x) else None


ZERO_REFERENCE = 1e-9
"""A reference tensor whose RMS is below this fraction of the problem's scale (the RMS of the
reference output or dV) is exactly zero up to fp64 rounding -- e.g. dQ and dK when every query
sees one key (``seqlen_kv: 1``, causal): softmax over one key is constant. Its relative error is
0/0; it is judged by its error relative to the problem's scale instead."""


def tensor_errors(x: torch.Tensor, ref: torch.Tensor, scale: Optional[float] = None) -> dict:
    """rel_l2, max_abs, cosine (fp64) and the count of NaN/Inf in ``x``. ``scale``: the RMS
    magnitude of the problem (see ZERO_REFERENCE); where the reference is zero against it,
    ``rel_l2`` is the error's RMS over ``scale`` and ``degenerate`` is set."""
    x64 = x.detach().to(torch.float64)
    r64 = ref.detach().to(torch.float64)
    nonfinite = int((~torch.isfinite(x64)).sum().item())
    if nonfinite:
        return {"rel_l2": math.inf, "max_abs": math.inf, "cosine": None, "nonfinite": nonfinite}
    diff = x64 - r64
    ref_norm = r64.norm().item()
    err_norm = diff.norm().item()
    count = max(1, r64.numel())
    degenerate = bool(scale) and ref_norm / math.sqrt(count) <= ZERO_REFERENCE * scale
    if degenerate:
        rel = err_norm / math.sqrt(count) / scale
    else:
        rel = err_norm / ref_norm if ref_norm > 0 else err_norm
    denom = x64.norm().item() * ref_norm
    cosine = (x64 * r64).sum().item() / denom if denom > 0 else (1.0 if err_norm == 0 else 0.0)
    result = {"rel_l2": rel, "max_abs": diff.abs().max().item() if diff.numel() else 0.0,
              "cosine": cosine, "nonfinite": 0}
    if degenerate:
        result["degenerate"] = True
    return result


def problem_scale(reference: dict) -> float:
    """RMS magnitude of the problem: of the reference output or dV (when there is one: not in
    a forward-only case), whichever is larger."""
    return max(_rms(t) for t in (reference["out"], reference.get("dv")) if t is not None)


def _rms(t: torch.Tensor) -> float:
    t64 = t.detach().to(torch.float64)
    return t64.norm().item() / math.sqrt(max(1, t64.numel()))


def determinism_checks(runs: list) -> list[Check]:
    """For a backend that declares ``deterministic = True``: every backward call on the same
    forward context must give bit-identical dQ, dK, dV. ``runs``: [(dq, dk, dv), ...] from
    repeated calls. Value: elements that differ from the first call in any later one (NaN
    compared by bits, so a NaN that moves is a difference and one that stays is not)."""
    checks = []
    for i, name in enumerate(("dq", "dk", "dv")):
        first = runs[0][i].detach()
        differ = torch.zeros(first.shape, dtype=torch.bool, device=first.device)
        worst = 0.0
        for later in runs[1:]:
            other = later[i].detach()
            if other.shape != first.shape or other.dtype != first.dtype:
                differ = torch.ones_like(differ)
                break
            differ |= _bits(first) != _bits(other)
            gap = (first.to(torch.float64) - other.to(torch.float64)).abs().nan_to_num(0.0)
            worst = max(worst, gap.max().item() if gap.numel() else 0.0)
        count = int(differ.sum().item())
        checks.append(Check("determinism", name, "elements_differing", float(count), 0.0,
                            count == 0, f"{len(runs)} calls, max |diff| {worst:.3g}"))
    return checks


def _bits(x: torch.Tensor) -> torch.Tensor:
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
    return x.contiguous().view(width)


def ratio_bound(dtype: str, kind: str, base_err: float, logit_scale: float) -> tuple[float, str]:
    """(bound, how it was made) for a tensor judged against a baseline of ``kind``."""
    logits = LOGIT_ROUNDINGS * ACCUMULATOR_EPS * logit_scale
    if kind == "fused":
        floor = FUSED_FLOOR[dtype] + logits
        return FUSED_FACTOR * base_err + floor, \
            f"{FUSED_FACTOR:g} x fused baseline {base_err:.3g} + {floor:.3g}"
    floor = RATIO_FLOOR[dtype] + logits
    return RATIO_FACTOR * base_err + floor, f"{RATIO_FACTOR:g} x naive {base_err:.3g} + {floor:.3g}"


def identity_bounds(dtype: str, conditioning: Optional[float],
                    baseline_residuals: Optional[dict[str, float]] = None) -> dict[str, float]:
    """Bound per identity; ``conditioning`` is the naive baseline's largest rel. L2 error on
    the same inputs (None when unknown); ``baseline_residuals``: identity -> the largest
    residual of the baselines' own gradients on the same inputs (a correct backward computed
    as they are), of which a backend may leave IDENTITY_BASELINE_FACTOR times as much."""
    scale = IDENTITY_BASELINE_FACTOR * conditioning if conditioning else 0.0
    left = baseline_residuals or {}
    return {name: max(bound, scale, IDENTITY_BASELINE_FACTOR * left.get(name, 0.0))
            for name, bound in IDENTITY_BOUND[bound_dtype(dtype)].items()}


def conditioning(baseline: Optional[dict]) -> Optional[float]:
    """Largest finite rel. L2 error of the naive baseline over the four tensors."""
    if not baseline:
        return None
    values = [e["rel_l2"] for e in baseline.values() if e["nonfinite"] == 0]
    return max(values) if values else None


def _fused_ratio(error: float, fused: Optional[dict]) -> dict:
    """A table row's ``fused_rel_l2`` and ``fused_ratio``: the tensor's error over a correct
    fused kernel's on the same inputs (none where that baseline is not finite or zero)."""
    if not fused or fused["nonfinite"] or not fused["rel_l2"] > 0:
        return {}
    return {"fused_rel_l2": fused["rel_l2"], "fused_ratio": error / fused["rel_l2"]}


class Ruling(NamedTuple):
    """What :func:`judge` decides from the measured errors."""

    verdict: str
    """``pass`` or ``fail``."""
    reason: str
    """The worst failed checks (at most three), or the reference's note on a pass."""
    checks: list[Check]
    table: dict
    """tensor -> its errors, bound, baseline and ratio: the record's ``accuracy.tensors``."""


def judge(*, dtype: str, backend: str, errors: Optional[dict], baseline: Optional[dict],
          identities: dict, softcap: float, reference_note: str,
          identity_bound: Optional[dict] = None, logit_scale: float = 0.0,
          baseline_kind: Optional[dict] = None,
          reference_roundings: Optional[dict] = None,
          fused: Optional[dict] = None) -> "Ruling":
    """The verdict, its reason, the checks and the per-tensor table, from measured errors.

    ``errors`` / ``baseline``: tensor -> tensor_errors() of the backend / its baseline against
    their fp64 references (None when no reference applies). ``baseline_kind``: tensor ->
    "fused" | "naive", the baseline each tensor is judged against (default "naive").
    ``logit_scale``: the largest finite |log-sum-exp| of the reference (see LOGIT_ROUNDINGS).
    ``reference_roundings``: tensor -> (factor, why) for the ``reference`` backend's tensors
    that a split rounded more than once (:func:`split_sum_roundings`).
    ``fused``: tensor -> the fused baseline's errors, whatever the tensor is judged against:
    each row carries ``fused_rel_l2`` and ``fused_ratio`` (the trends and findings read them).
    """
    dtype = bound_dtype(dtype)
    checks: list[Check] = []
    table: dict[str, dict] = {}
    if errors is not None:
        for name in (t for t in TENSORS if t in errors):  # forward only: "out" alone
            e = errors[name]
            row = dict(e)
            if e["nonfinite"]:
                checks.append(Check("nonfinite", name, "count", float(e["nonfinite"]), 0.0, False))
                row.update(bound=None, baseline_rel_l2=None, ratio=None)
                table[name] = {k: _finite_or_none(v) if isinstance(v, float) else v
                               for k, v in row.items()}
                continue
            kind = (baseline_kind or {}).get(name, "naive")
            base_err = None
            if backend == "reference":
                bound, note, check = REFERENCE_SELF_BOUND[dtype], "fp64 rounded once", "reference"
                if name in (reference_roundings or {}):
                    factor, why = reference_roundings[name]
                    bound, note = bound * factor, why
            elif baseline is not None and backend != "naive" and baseline.get(name) \
                    and baseline[name]["nonfinite"] == 0:
                base_err = baseline[name]["rel_l2"]
                bound, note = ratio_bound(dtype, kind, base_err, logit_scale)
                check = "baseline_ratio"
            else:
                bound = ABSOLUTE_BOUND[dtype][name]
                note, check = f"absolute {dtype} bound", "reference"
            if e.get("degenerate"):
                note += "; the exact tensor is zero: error relative to the problem's scale"
            passed = e["rel_l2"] <= bound
            checks.append(Check(check, name, "rel_l2", e["rel_l2"], bound, passed, note))
            row.update(bound=bound, baseline_rel_l2=base_err,
                       ratio=(e["rel_l2"] / base_err) if base_err else None,
                       baseline=kind if base_err is not None else None,
                       **_fused_ratio(e["rel_l2"], (fused or {}).get(name)))
            table[name] = {k: _finite_or_none(v) if isinstance(v, float) else v
                           for k, v in row.items()}
    bounds = identity_bound or IDENTITY_BOUND[dtype]
    for name, value in identities.items():
        bound = bounds[name]
        ok = value is not None and math.isfinite(value) and value <= bound
        if value is None or not math.isfinite(value):
            continue  # non-finite gradients are reported by the nonfinite check
        checks.append(Check("identity", name, "residual", value, bound, ok))
    failed = [c for c in checks if not c.passed]
    if errors is None and not identities:
        return Ruling("fail", "no accuracy check could be made", checks, table)
    if failed:
        worst = sorted(failed, key=lambda c: -(c.value or math.inf) / (c.bound or 1e-300))
        return Ruling("fail", "; ".join(c.describe() for c in worst[:3]), checks, table)
    reason = "" if reference_note in ("exact", "exact-mask", "recovered-mask") else reference_note
    return Ruling("pass", reason, checks, table)
