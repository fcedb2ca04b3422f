"""Each case's values over the runs of a history, per GPU kind, and the steps in them.

A case is found in every run as ``attnbench compare`` finds it: by its case minus ``gpu``
(``match_key``) on one exact GPU kind (``run_gpu``,
:func:`~attnbench.report.compare.comparison._keyed`'s columns). A history never mixes GPU
kinds: a run on two kinds is in two histories, one per kind.

Per case and run, three values (:data:`METRICS`): the forward and backward median times (ms;
their spread ``(q3 - q1) / 1.349`` is the run's own noise) and the error, the worst relative L2
error over out, dQ, dK, dV of a judged case (pass or fail; NaN otherwise). Steps are found in
each (:func:`~attnbench.report.history.steps.find_steps`); a step names the run it appeared
in, the run before it, whether the case's backend code (module, version, source hash) changed
between them, and the commits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd

from attnbench.report.compare.comparison import _keyed
from attnbench.report.history.collect import HistoryRun
from attnbench.report.history.steps import IQR_TO_SIGMA, Step, find_steps
from attnbench.report.read.code_changes import CODE_FIELDS
from attnbench.report.read.data import DIRECTIONS
from attnbench.results.records import JUDGED_VERDICTS, TENSORS

ERROR = "error"
METRICS = (*DIRECTIONS, ERROR)
"""What a history follows per case: each direction's median time, and the worst error."""
UNITS = {**{d: f"{d} ms" for d in DIRECTIONS}, ERROR: "worst rel. L2 error"}


@dataclass(frozen=True)
class FoundStep:
    """A step of one case's metric, placed among the runs of its history."""

    metric: str
    step: Step
    run: int
    """The run it appeared in (an index of :attr:`GpuHistory.runs`)."""
    before: int
    """The last run before it with a value."""
    code: list[str] | None
    """What changed in the backend's code between those runs (``source a -> b``): [] when
    nothing did, None when either run's records do not say."""

    @property
    def rise(self) -> bool:
        """Slower, or a larger error."""
        return self.step.after > self.step.before


@dataclass
class CaseHistory:
    key: Any
    label: str
    backend: str
    values: dict[str, np.ndarray]
    """Metric -> one value per run of the history (NaN: not in that run, or no value)."""
    verdicts: list[str]
    """One per run ("" where the run lacks the case)."""
    steps: list[FoundStep] = field(default_factory=list)


@dataclass
class GpuHistory:
    """The history of one GPU kind: its runs in order and its cases."""

    gpu: str
    runs: list[HistoryRun]
    cases: list[CaseHistory]

    @property
    def steps(self) -> list[tuple[CaseHistory, FoundStep]]:
        return [(c, s) for c in self.cases for s in c.steps]


def code_change(before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[str] | None:
    """``["source 763ae9d4ddeb -> 4e21dcc8c544"]``: what differs between a backend's code in
    two runs (:data:`~attnbench.report.read.code_changes.CODE_FIELDS`); None when either
    run does not say, or they share no field."""
    if not before or not after:
        return None
    shared = [(label, key) for label, key in CODE_FIELDS if key in before and key in after]
    if not shared:
        return None
    return [f"{label} {before[key]} -> {after[key]}" for label, key in shared
            if before[key] != after[key]]


def _values(frame: pd.DataFrame) -> pd.DataFrame:
    """Per row of a run's frame: each metric, the timings' spreads, verdict, label, backend."""
    out = pd.DataFrame(index=frame.index)
    for d in DIRECTIONS:
        out[d] = pd.to_numeric(frame[f"{d}_median_ms"], errors="coerce")
        out[f"{d}_spread"] = (pd.to_numeric(frame[f"{d}_q3_ms"], errors="coerce")
                              - pd.to_numeric(frame[f"{d}_q1_ms"], errors="coerce")) / IQR_TO_SIGMA
    errors = frame[[f"{t}_rel_l2" for t in TENSORS]].apply(pd.to_numeric, errors="coerce")
    judged = frame.verdict.astype(str).isin(JUDGED_VERDICTS)
    out[ERROR] = errors.max(axis=1, skipna=True).where(judged)
    for name in ("verdict", "label", "backend"):
        out[name] = frame[name].astype(object).where(frame[name].notna(), "").astype(str)
    return out


def build_histories(runs: Sequence[HistoryRun], threshold: float = 0.05,
                    error_threshold: float = 0.25) -> list[GpuHistory]:
    """One history per GPU kind (sorted by name), its runs in the order given, its cases in
    the order first seen; steps of the times by ``threshold``, of the error by
    ``error_threshold`` (relative)."""
    frames = []
    for r in runs:
        keyed = _keyed(r.run)
        frames.append((keyed.run_gpu.astype(str).to_numpy(),
                       _values(keyed).set_axis(keyed.match_key.to_numpy())))
    kinds = sorted({k for gpus, _ in frames for k in set(gpus)})
    return [_history(kind, runs, frames, threshold, error_threshold) for kind in kinds]


def _history(kind: str, runs: Sequence[HistoryRun], frames: list, threshold: float,
             error_threshold: float) -> GpuHistory:
    mine = [(run, values[gpus == kind]) for run, (gpus, values) in zip(runs, frames)
            if (gpus == kind).any()]
    keys = pd.Index(pd.unique(np.concatenate([v.index.to_numpy() for _, v in mine])))
    table = [v.reindex(keys) for _, v in mine]  # a run each, a row per case of the history
    columns = {name: np.column_stack([t[name].to_numpy(dtype=float) for t in table])
               for name in (*METRICS, *(f"{d}_spread" for d in DIRECTIONS))}
    texts = {name: np.column_stack([t[name].fillna("").to_numpy(dtype=object) for t in table])
             for name in ("verdict", "label", "backend")}
    cases = []
    for i, key in enumerate(keys):
        # the latest run's label; a journal edited by hand may have none
        last = max((j for j in range(len(table)) if texts["label"][i, j]), default=-1)
        case = CaseHistory(key=key, label=texts["label"][i, last] or "(no label)",
                           backend=texts["backend"][i, last],
                           values={m: columns[m][i] for m in METRICS},
                           verdicts=list(texts["verdict"][i]))
        for metric in METRICS:
            spreads = columns.get(f"{metric}_spread")
            found = find_steps(case.values[metric],
                               error_threshold if metric == ERROR else threshold,
                               None if spreads is None else spreads[i])
            case.steps += [FoundStep(metric, s, s.at, s.last_before, code_change(
                mine[s.last_before][0].run.backend_code.get(case.backend),
                mine[s.at][0].run.backend_code.get(case.backend))) for s in found]
        cases.append(case)
    return GpuHistory(gpu=kind, runs=[run for run, _ in mine], cases=cases)
