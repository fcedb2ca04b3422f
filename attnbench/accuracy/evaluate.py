"""Judging one case's results: the one place both case runners (single- and multi-rank) use.

Given the inputs and a backend's out/dq/dk/dv, :func:`evaluate` measures errors against the
fp64 reference (when one applies), a baseline's errors on the same inputs -- the fused-precision
baseline, or for tensors the backend computes in the input dtype by design the naive backend
(:func:`input_precision`) -- the reference-free identities, and the log-sum-exp the backend
returned (:mod:`attnbench.accuracy.lse_check`), and returns a :class:`Judgement`. Further
checks (determinism of repeated backward calls, CP/TP parity) are folded in with
:meth:`Judgement.merged`. Bounds and the per-check verdict rule live in
:mod:`attnbench.accuracy.bounds`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, Sequence

import torch

from attnbench.accuracy import bounds as acc
from attnbench.accuracy.dropout_independence import MaskParts
from attnbench.accuracy.dropout_probe import judge_dropout
from attnbench.accuracy.rng import RngState
from attnbench.accuracy.fp8_split import quantization_split
from attnbench.accuracy.fused_baseline import FusedBaseline, fused_backward, fused_forward
from attnbench.accuracy.invariants import identity_residuals
from attnbench.accuracy.lse_check import lse_checks, scores_dtype
from attnbench.backends import Capabilities, get_backend
from attnbench.backends.masks import release_prepared
from attnbench.errors import is_oom
from attnbench.problem.dropout import hash_keep_mask
from attnbench.problem.fp8 import FORMATS, dequantize_call, output_dtype
from attnbench.problem.reference import reference_backward, reference_forward
from attnbench.results.records import TENSORS

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


def timed_only(out: torch.Tensor, grads: Optional[Sequence[torch.Tensor]]) -> Judgement:
    """``accuracy: false``: no reference, no baseline -- but a NaN or Inf is still a failure."""
    checks = []
    for name, tensor in zip(TENSORS, (out, *(grads or ()))):
        count = int((~torch.isfinite(tensor)).sum().item())
        checks.append(acc.Check("nonfinite", name, "count", float(count), 0.0, count == 0))
    return Judgement("timed", "accuracy not checked (accuracy: false)").merged(checks)


def input_precision(backend, case, device) -> frozenset[str]:
    """Tensors ``backend`` computes in the input dtype by design (judged against the naive
    baseline); every other tensor is judged against the fused baseline. Declared by the
    backend's optional ``input_precision(case, device)``
    (:class:`~attnbench.backends.capabilities.Capabilities`); a backend that does not declare it
    is a fused kernel."""
    declared = Capabilities.of(backend).input_precision
    return frozenset(declared(case, device)) if declared is not None else frozenset()


BACKWARD_NOT_APPLICABLE = "not applicable: forward only (decode, or backward: false)"
"""The record's ``accuracy.backward`` of a forward-only case: no gradient was asked for, so
none is judged or timed -- not ``unsupported`` (nothing was refused), not a failure."""


class References:
    """fp64 references of one case's inputs, one per dropout mask (one in all without dropout),
    each computed once; ``tensors``: ("out",) for a forward-only case."""

    def __init__(self, q, k, v, dout, spec, tensors: Sequence[str] = TENSORS):
        self.inputs, self.spec, self.tensors = (q, k, v, dout), spec, tuple(tensors)
        self._cache: dict[Any, dict] = {}

    def get(self, keep_mask) -> dict:
        key = keep_mask if self.spec.dropout_p > 0 else None
        if key not in self._cache:
            q, k, v, dout = self.inputs
            out, lse = reference_forward(q, k, v, self.spec, keep_mask=keep_mask)
            self._cache[key] = {"out": out, "lse": lse}
            if "dq" in self.tensors:
                dq, dk, dv = reference_backward(q, k, v, out, lse, dout, self.spec,
                                                keep_mask=keep_mask)
                self._cache[key].update(dq=dq, dk=dk, dv=dv)
        return self._cache[key]

    def errors(self, results: dict, keep_mask) -> dict:
        ref = self.get(keep_mask)
        scale = acc.problem_scale(ref)
        return {t: acc.tensor_errors(results[t], ref[t], scale) for t in self.tensors}

    def lse(self) -> torch.Tensor:
        """The fp64 reference's log-sum-exp: dropout does not enter it, so any mask's (one
        already computed), else a forward without dropout (no backward)."""
        for ref in self._cache.values():
            return ref["lse"]
        q, k, v, _ = self.inputs
        return reference_forward(q, k, v, self.spec.replace(dropout_p=0.0))[1]

    def logit_scale(self) -> float:
        """Largest finite |lse| of the fp64 reference (any entry: dropout does not change it)."""
        for ref in self._cache.values():
            finite = ref["lse"][torch.isfinite(ref["lse"])]
            return float(finite.abs().max()) if finite.numel() else 0.0
        return 0.0


def evaluate(case, backend, spec, q, k, v, dout, out, grads, device=None,
             rng: Optional[RngState] = None, originals=None,
             reference_roundings: Optional[dict] = None,
             lse: Optional[torch.Tensor] = None,
             mask_parts: Optional[MaskParts] = None) -> Judgement:
    """Errors against fp64 (when a reference applies), baseline errors and identities.

    ``rng``: the state of the generator a hidden-mask backend's dropout drew from, captured right
    before the judged forward (:mod:`attnbench.accuracy.dropout_probe`); with it the mask is
    recovered and the exact reference applies, without it statistics judge the forward's dropout.
    fp8 cases (``spec.fp8_format``): q, k, v are the fp8 values; the reference is exact on
    their dequantized numbers, and ``originals`` (q, k, v before quantization) give the
    quantization / kernel split of :mod:`attnbench.accuracy.fp8_split`.
    ``reference_roundings``: see :func:`attnbench.accuracy.bounds.judge`.
    ``lse``: the log-sum-exp the backend returned (``Forward.lse``; a CP/TP run's gathered
    one), judged against the reference's by the ``lse`` check
    (:mod:`attnbench.accuracy.lse_check`); None: the backend returned none. ``mask_parts``: a
    CP/TP run's keep-mask probe, gathered from its ranks (:mod:`attnbench.execution.multi`):
    the split run's own mask, checked against the single-device replay and for independence
    between its parts (:mod:`attnbench.accuracy.dropout_independence`)."""
    device = device or q.device
    tensors = TENSORS if grads is not None else ("out",)  # grads None: forward only
    results = dict(zip(tensors, (out, *(grads or ()))))
    keep_mask = Capabilities.of(backend).keep_mask
    exact_inputs = dequantize_call(q, k, v, spec, torch.float64) if spec.fp8_format else (q, k, v)
    refs = References(*exact_inputs, dout, spec, tensors)
    errors, dropout = None, None
    note = "exact-mask" if spec.dropout_p > 0 else "exact"
    if spec.dropout_p > 0:  # hidden: recovered or statistics; exposed: its independence
        dropout = judge_dropout(backend, q, k, v, spec, out, rng, mask_parts=mask_parts,
                                split=case.world_size > 1)
    if dropout is not None and keep_mask is None:
        keep_mask = dropout.keep_mask
        note = dropout.method if keep_mask is not None else (
            f"{dropout.method}: the backend hides its dropout mask and it could not be "
            "recovered; dropout statistics and the identities decide")
    if keep_mask is not None or spec.dropout_p == 0:
        errors = refs.errors(results, keep_mask)
    measured = _baselines(case, backend, spec, q, k, v, dout, refs, device)
    baseline = {t: e for t, (_, e) in measured.judged_by.items() if e is not None} or None
    kinds = {t: kind for t, (kind, _) in measured.judged_by.items()}
    scale = acc.conditioning(errors if case.backend == "naive" else measured.scale)
    identities = {} if grads is None else identity_residuals(
        q, k, v, out, dout, *grads, softcap=spec.softcap, cu_seqlens_q=spec.cu_seqlens_q,
        cu_seqlens_kv=spec.cu_seqlens_kv)
    zero = {t for t, e in (errors or {}).items() if e.get("degenerate")}
    if zero & {"dq", "dk"}:
        # dQ = dK = 0 exactly (every query sees one key): <dQ,Q> = <dK,K> and sum dK = 0 read
        # 0 = 0 and their normalisation is 0/0; the reference judges those tensors.
        identities = {n: r for n, r in identities.items() if n == "dv_v"}
    bounds = acc.identity_bounds(case.dtype, scale, measured.residuals)
    ruling = acc.judge(
        dtype=case.dtype, backend=case.backend, errors=errors, baseline=baseline,
        identities=identities, softcap=spec.softcap, reference_note=note,
        identity_bound=bounds, logit_scale=refs.logit_scale(), baseline_kind=kinds,
        reference_roundings=reference_roundings, fused=measured.fused)
    accuracy = {
        "reference": note,
        "tensors": ruling.table,
        "identities": {name: {"value": acc._finite_or_none(value), "bound": bounds[name]}
                       for name, value in identities.items()},
    }
    if grads is None:
        accuracy["backward"] = BACKWARD_NOT_APPLICABLE
    if spec.fp8_format and originals is not None:
        accuracy["fp8"] = quantization_split(case, spec, out, refs.get(None), exact_inputs,
                                             originals)
    judgement = Judgement(ruling.verdict, ruling.reason, tuple(ruling.checks), accuracy)
    if dropout is not None:
        judgement = judgement.merged(dropout.checks, "dropout: ", dropout=dropout.to_dict())
    if lse is not None:
        declared = "out" in input_precision(backend, case, device)
        checks, section = lse_checks(lse, refs.lse(), scores_dtype(lse, case.dtype, declared))
        judgement = judgement.merged(checks, lse=section)
    return judgement


class Baselines(NamedTuple):
    """What the baselines of one case measured on its inputs."""

    judged_by: dict[str, tuple[str, Optional[dict]]]
    """tensor -> (baseline kind, its errors against its own fp64 reference)."""
    scale: Optional[dict]
    """Errors on the naive baseline's scale (:func:`_naive_scale`): the identities' bounds grow
    with their largest (``bounds.conditioning``)."""
    residuals: dict[str, float]
    """identity -> the largest residual of the baselines' own gradients: what a correct backward
    computed as one of them leaves on these inputs."""
    fused: dict[str, dict]
    """tensor -> the fused baseline's errors, for every tensor (empty for ``reference``)."""


def _baselines(case, backend, spec, q, k, v, dout, refs: References, device) -> Baselines:
    if case.backend == "reference":
        return Baselines({}, None, {}, {})
    # Every tensor of every backend is measured against the fused baseline too, whatever it is
    # judged against: a declaration chooses the bound, never what is shown (the trends and
    # findings of attnbench.report.read.trends run on these ratios).
    fused, fused_left = _fused_errors(q, k, v, dout, spec, refs)
    if case.backend == "naive":  # naive is held to absolute bounds; its ratio is carried
        return Baselines({}, None, {}, fused)
    low = set(input_precision(backend, case, device)) & set(refs.tensors)
    naive = _naive_errors(q, k, v, dout, spec, refs) if low else None
    judged_by = {t: _declared_baseline(case.dtype, t, naive, fused) if t in low
                 else ("fused", fused[t]) for t in refs.tensors}
    # how ill-conditioned the inputs are: autograd's errors, on which the identity bounds were
    # calibrated (beside a sink the flash-style dQ/dK error is those tensors' own, not the
    # inputs': taken as conditioning it would loosen dv_v and dq_q tenfold there)
    scaled = {t: ("naive", naive and naive.autograd[t]) if t in low else judged_by[t]
              for t in refs.tensors}
    # the fused baseline's residuals loosen the identities only where it judges a tensor
    left = fused_left if any(kind == "fused" for kind, _ in judged_by.values()) else {}
    return Baselines(judged_by, _naive_scale(scaled),
                     _largest(naive.residuals if naive else {}, left), fused)


def _declared_baseline(dtype: str, tensor: str, naive: Optional[NaiveErrors],
                       fused: dict) -> tuple[str, Optional[dict]]:
    """The baseline of a tensor the backend computes in the input dtype by design: naive's
    error -- unless naive itself is off by more than its own absolute bound (eager ALiBi added
    in bf16 where every key is far from the query: 0.17-0.21, docs/findings.md), where a bound
    of twice that would pass anything: then the fused baseline's, as for a fused kernel. (Off:
    the naive backend's own tensor -- autograd's -- fails the bound it is held to.)"""
    if naive is None:
        return "naive", None
    own = naive.autograd[tensor]
    if own["nonfinite"] == 0 \
            and own["rel_l2"] > acc.ABSOLUTE_BOUND[acc.bound_dtype(dtype)][tensor]:
        return "fused", fused[tensor]
    return "naive", naive.worst[tensor]


def _naive_scale(judged_by: dict) -> Optional[dict]:
    """Errors on the naive baseline's scale, which the identity bounds were calibrated on: the
    naive errors where they were measured, else the fused baseline's x NAIVE_OVER_FUSED."""
    scaled = {}
    for t, (kind, e) in judged_by.items():
        if e is None:
            continue
        factor = 1.0 if kind == "naive" else NAIVE_OVER_FUSED
        scaled[t] = dict(e, rel_l2=e["rel_l2"] * factor)
    return scaled or None


NAIVE_OVER_FUSED = 2.0
"""naive's error over the fused baseline's on the same inputs: 1.6-1.9 measured (bf16/fp16,
S 256-4096, benchmarks/baseline_memory.py); the identity bounds scale with the naive error."""


class NaiveErrors(NamedTuple):
    worst: dict
    """tensor -> the errors of the worse of naive's two backwards (forward only: out's)."""
    autograd: dict
    """tensor -> the errors with autograd's gradients."""
    residuals: dict[str, float]
    """identity -> the larger residual of the two backwards' gradients."""


def _naive_errors(q, k, v, dout, spec, refs: References) -> Optional[NaiveErrors]:
    """Errors of the naive backend on the same inputs, against its own exact reference; None
    where its S x S matrices do not fit. Its gradients are computed two ways, each tensor judged
    against the worse: autograd, and recomputed from the output and log-sum-exp as a
    flash-style kernel does (:meth:`~attnbench.backends.naive.NaiveBackend.backward_from_stats`:
    delta = rowsum(dO * O) from the rounded O). Both are correct in the input dtype. They agree
    within 1.0-1.4x, except where the softmax gradient cancels: beside an attention sink (delta
    ~ the sink key's dP) the flash-style dQ and dK are 12-15x autograd's in bf16, and dk_sum's
    residual 0.25 against 0.007 (``python benchmarks/sink_baselines.py``) -- where a correct
    fused kernel (sdpa's flash backward, ours) sits too."""
    naive = get_backend("naive")
    try:
        fwd = naive.forward(q, k, v, spec)
        if "dq" not in refs.tensors:
            out = refs.errors({"out": fwd.out}, naive.keep_mask)
            return NaiveErrors(out, out, {})
        ways = [naive.backward(fwd.ctx, dout)]
        try:  # its fp32 S x S may not fit where autograd's did: then autograd alone
            ways.append(naive.backward_from_stats(q, k, v, fwd.out, fwd.lse, dout, spec))
        except Exception as exc:
            if not is_oom(exc):
                raise
    except Exception as exc:
        if is_oom(exc):
            return None
        raise
    finally:
        release_prepared(naive)
    measured = [refs.errors(dict(zip(refs.tensors, (fwd.out, *grads))), naive.keep_mask)
                for grads in ways]
    return NaiveErrors({t: max((e[t] for e in measured), key=_worse) for t in refs.tensors},
                       measured[0],
                       _largest(*(_residuals(q, k, v, fwd.out, dout, g, spec) for g in ways)))


def _largest(*residuals: dict[str, float]) -> dict[str, float]:
    """identity -> its largest residual among those given."""
    found: dict[str, float] = {}
    for each in residuals:
        for name, r in each.items():
            found[name] = max(r, found.get(name, r))
    return found


def _residuals(q, k, v, out, dout, grads, spec) -> dict[str, float]:
    """A baseline's identity residuals (:func:`identity_residuals`), the NaN of non-finite
    gradients left out."""
    found = identity_residuals(q, k, v, out, dout, *grads, softcap=spec.softcap,
                               cu_seqlens_q=spec.cu_seqlens_q, cu_seqlens_kv=spec.cu_seqlens_kv)
    return {name: r for name, r in found.items() if r == r}


def _worse(errors: dict) -> tuple[bool, float]:
    """Order of two baselines' errors of one tensor: a finite one above a non-finite one (a
    baseline with NaN is no baseline), then the larger relative L2."""
    return errors["nonfinite"] == 0, errors["rel_l2"]


def _fused_errors(q, k, v, dout, spec, refs: References) -> tuple[dict, dict[str, float]]:
    """Errors of the fused-precision baseline on the same inputs (its dropout mask: the hash
    mask of :mod:`attnbench.problem.dropout`), against its own exact reference, and the identity
    residuals of its gradients. fp8: FA3's roundings
    (fp8 operands, P in the inputs' fp8 format, O in bf16) on the dequantized values."""
    if spec.fp8_format:
        baseline = FusedBaseline(p_format=FORMATS[spec.fp8_format],
                                 out_dtype=output_dtype(spec.fp8_format))
        out, _ = baseline.forward(*dequantize_call(q, k, v, spec, torch.float32), spec)
        return refs.errors({"out": out}, hash_keep_mask), {}
    out, lse = fused_forward(q, k, v, spec, keep_mask=hash_keep_mask)
    grads = (fused_backward(q, k, v, out, lse, dout, spec, keep_mask=hash_keep_mask)
             if "dq" in refs.tensors else ())
    return (refs.errors(dict(zip(refs.tensors, (out, *grads))), hash_keep_mask),
            _residuals(q, k, v, out, dout, grads, spec) if grads else {})


def check_determinism(judgement: Judgement, backend, ctx, dout, grads) -> Judgement:
    """For a backend that declares ``deterministic = True``: repeated backward calls on one
    forward context must return bit-identical gradients."""
    runs = [tuple(grads)] + [tuple(backend.backward(ctx, dout))
                             for _ in range(DETERMINISM_CALLS - 1)]
    found = acc.determinism_checks(runs)
    return judgement.merged(found, determinism={c.tensor: int(c.value) for c in found})
