"""Compare runs: the same cases side by side, what got faster, slower, or changed its verdict.

Cases are matched on their case dict minus ``gpu`` (so a sweep run on an H100 and on an A100
matches case for case), and within a match on the exact GPU kind that actually ran it
(``record.env.gpu_kind``: ``H100-SXM5-80GB`` and ``H100-PCIe-80GB`` are two kinds) when both
runs have it.

Timing, per direction (fwd, bwd), compares robust intervals, the median with ``[min, q3]``,
by the rule of :mod:`attnbench.report.compare.gate` (default threshold 5%): SLOW when B's best
sample is slower than most of A's by the threshold, FAST the other way round, SAME when the
medians agree and both spreads settled, AMBIGUOUS otherwise.

SLOW and FAST need no settled spread: B's best sample slower than A's q3 by ``t`` is a
slowdown however wide either spread was (a noisy shared box widens intervals, it does not move
every sample of B past most of A's). Per backend, a change of its code between the runs (module,
version, source hash) is a warning naming it, and so is a change of the run options
(:mod:`attnbench.report.read.code_changes`).

Across different GPU kinds there is no verdict, only the ratio (class ``RATIO``). A regression,
which makes ``attnbench compare`` exit with status 1, is on the same GPU kind: a SLOW case, or a
case that went from a good verdict to a bad one on something both runs checked -- pass to any
failing verdict (fail, error, crash, timeout, oom, lost), or "timed" (ran with ``accuracy:
false``, not judged) to a case that did not run to the end (error, crash, timeout, oom, lost).
Accuracy is compared between judged verdicts only (``records.JUDGED_VERDICTS``): a case not
judged on one side (pass -> timed) is neither a verdict change nor a regression.

The runs' environments (driver, CUDA, cuDNN, NCCL, torch, triton, clocks, power limit, commit)
are compared too, and every difference is a warning line (:mod:`attnbench.report.read.environment`).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection, Sequence

import numpy as np
import pandas as pd
from pandas.api.extensions import ExtensionDtype

from attnbench.report.compare.gate import classify as _classify, float_column
from attnbench.report.compare.gate import timing_columns as _timing_columns
from attnbench.report.read.code_changes import backend_warnings, options_warnings
from attnbench.report.read.data import DIRECTIONS, Run
from attnbench.report.read.environment import (kind_text, mixed_kinds, representative, run_warnings,
                                          software_text, warned_labels)
from attnbench.report.read.pool import read_run_jobs
from attnbench.report.page.style import verdict_label
from attnbench.results.records import (BAD_VERDICTS, DIED_VERDICTS, JUDGED_VERDICTS,
                                       NOT_JUDGED_VERDICTS, RAN_VERDICTS, TENSORS)

FAIL_ON = ("speed", "accuracy", "both")
"""What makes ``attnbench compare`` exit 1: SLOW cases, verdict regressions, or either."""
CLASSES = ("SLOW", "FAST", "AMBIGUOUS", "SAME", "RATIO", "n/a")
MAX_LISTED = 25  # regressions printed to stdout; the dashboard lists all
NOISY_WHY = "too noisy: spread never settled"
COMPARED = ("id", "label", "verdict", "reason", "features", "backend", "dtype", "seqlen_q",
            "gpu_kind", "gpu_family", "env_attnbench", "env_torch", "env_triton",
            "measured_peak_tflops", "match_key",
            *(f"{d}_{s}" for d in DIRECTIONS for s in ("median_ms", "min_ms", "q1_ms", "q3_ms",
                                                        "n", "noisy")),
            *(f"{t}_rel_l2" for t in TENSORS))
"""The frame columns a comparison reads of each run (its pages and formats too): a run of
10^6 cases is loaded as these ~30 columns, not the report's ~100 (:func:`load_compared`)."""


NAMES = {"a": ("id",), "b": ("id", "label")}
"""Text of each side that the pairs do not hold (``id_a``, ``id_b``, ``label_b``): taken only
for the pairs an output names (:meth:`Comparison.named`; ~110 B a pair, ~0.1 GiB at 10^6
pairs, when every pair held them)."""
PAIRED = frozenset({
    *(f"{name}_{s}" for s in "ab" for name in ("verdict", "gpu_family", "run_gpu",
                                              *(f"{d}_median_ms" for d in DIRECTIONS))),
    *(f"{name}_b" for name in ("reason", "features", "backend", "dtype", "seqlen_q"))})
"""The columns of the two runs that the pairs hold: those the outputs read (text, JSON,
markdown, the page). The rest of the compared columns (timing statistics, errors) are taken a
few at a time to compute the pairs' classes and ratios, then let go (:func:`compare_runs`):
holding all ~84 was ~590 B a pair, 0.6 GiB at 10^6 pairs."""


@dataclass
class Comparison:
    """Run B against baseline run A; ``pairs`` has one row per matched (case, GPU kind pair);
    its ``row_a`` / ``row_b`` are the pair's rows in ``names_a`` / ``names_b`` (:data:`NAMES`:
    :meth:`named` adds them to the pairs an output names)."""

    a: Run
    b: Run
    threshold: float
    pairs: pd.DataFrame
    only_a: pd.DataFrame
    only_b: pd.DataFrame
    differences: list[str] = field(default_factory=list)
    """Facts of the runs that differ (GPU kinds, sweep, versions not in ``warnings``)."""
    warnings: list[str] = field(default_factory=list)
    """``runs differ in torch: 2.5.1 -> 2.6.0``: environment differences, one line each."""
    names_a: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)
    names_b: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)

    def named(self, pairs: pd.DataFrame) -> pd.DataFrame:
        """``pairs`` (rows of :attr:`pairs`) with ``id_a``, ``id_b`` and ``label_b``, taken
        for these rows only."""
        columns = {}
        for side, names in (("a", self.names_a), ("b", self.names_b)):
            at = pairs[f"row_{side}"].to_numpy()
            for name in names.columns:
                columns[f"{name}_{side}"] = names[name].array.take(at)
        return pairs.assign(**columns)

    @property
    def regressions(self) -> pd.DataFrame:
        return self.regressions_on("both")

    def regressions_on(self, fail_on: str) -> pd.DataFrame:
        """The regressions a gate counts (:data:`FAIL_ON`): ``speed``, a case SLOW on the same
        GPU kind; ``accuracy``, a case from a good verdict to a bad one; ``both``; :meth:`named`.
        Verdict regressions first, the worst error ratio B/A first, then the largest slowdown."""
        p = self.pairs
        if p.empty:
            return self.named(p)
        slow = p.same_kind & ((p.fwd_class == "SLOW") | (p.bwd_class == "SLOW"))
        keep = pd.Series(False, index=p.index)
        if fail_on in ("speed", "both"):
            keep |= slow
        if fail_on in ("accuracy", "both"):
            keep |= p.verdict_regression
        reg = p[keep]
        worst_speed = reg[[f"{d}_speed" for d in DIRECTIONS]].min(axis=1).fillna(1.0)
        worst_error = (-reg.worst_err_ratio.fillna(0.0)).where(reg.verdict_regression, 0.0)
        return self.named(reg.assign(_o=~reg.verdict_regression, _e=worst_error, _s=worst_speed)
                          .sort_values(["_o", "_e", "_s"], kind="stable")
                          .drop(columns=["_o", "_e", "_s"]))


def _keyed(run: Run) -> pd.DataFrame:
    # match_key: the case without gpu (report.reading). A case that died before it reached a
    # device may have no env.gpu_kind: in a run on one GPU kind it ran on that kind; otherwise
    # "?" matches any kind (see compare_runs). assign, not a copy: the frame's columns are
    # shared, not copied (copy on write), which at 10^6 rows is ~0.3 GB a run.
    kinds = run.gpu_kinds
    df = run.frame.assign(run_gpu=_text(run.frame.gpu_kind).fillna(
        kinds[0] if len(kinds) == 1 else "?").astype(str))
    return df.drop_duplicates(["match_key", "run_gpu"], keep="last")


def _text(column: pd.Series) -> pd.Series:
    """A column as plain values: a categorical one (report.reading.CATEGORICAL) refuses to be
    filled with a value not among its categories ("?")."""
    return column.astype(object) if isinstance(column.dtype, pd.CategoricalDtype) else column


def _places(n: int) -> np.ndarray:
    """Row places 0..n-1, int32 where they fit (half the bytes of int64 in a merge of 3 rows a
    record)."""
    return np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)


def _paired_rows(fa: pd.DataFrame, fb: pd.DataFrame) -> pd.DataFrame:
    """Which row of ``fa`` meets which of ``fb`` (``row_a``, ``row_b``): same-kind pairs in the
    merge's order, then the cross-kind pairs of records with no twin on their own kind (see
    compare_runs). The merge on the case alone meets every kind of A with every kind of B (k^2
    rows a case on k GPU kinds): it is made of the key, a code of the kind and the row's place
    only (~20 B a row), never of the ~60 compared columns (1.4 KB a row: 3.6 GiB for 10^6
    cases on 3 kinds), nor of the kinds' names (a Python string a row: ~0.3 GiB there)."""
    kinds = pd.Index(sorted(set(fa.run_gpu.unique()) | set(fb.run_gpu.unique())), dtype=object)
    unknown_code = kinds.get_indexer(["?"])[0]  # -1, which no row has, when none is unknown
    code_type = np.min_scalar_type(len(kinds))

    def narrow(f: pd.DataFrame) -> pd.DataFrame:
        codes, names = pd.factorize(f.run_gpu)  # the few names looked up, not every row's
        return pd.DataFrame({"match_key": f.match_key.to_numpy(),
                             "kind": kinds.get_indexer(names).astype(code_type)[codes],
                             "row": _places(len(f))})
    m = narrow(fa).merge(narrow(fb), on="match_key", suffixes=("_a", "_b"))
    kind_a, kind_b = m.kind_a.to_numpy(), m.kind_b.to_numpy()
    unknown = (kind_a == unknown_code) | (kind_b == unknown_code)
    same = (kind_a == kind_b) | unknown
    # A record with no twin on its own GPU kind is set against the other run's records of the
    # same case on other kinds: a ratio, never a verdict. Membership of (case, kind) as one
    # number, the case's code times the kinds plus the kind's (a set of 10^6 (key, kind)
    # tuples was ~0.1 GB).
    case = pd.factorize(m.match_key.to_numpy())[0] * len(kinds)
    paired = (case + kind_a)[same]
    lone = ~np.isin(case + kind_a, paired) | ~np.isin(case + kind_b, paired)
    del case, paired
    cross = ~same & lone
    return pd.DataFrame({f"row_{s}": np.concatenate([m[f"row_{s}"].to_numpy()[same],
                                                     m[f"row_{s}"].to_numpy()[cross]])
                         for s in "ab"})


def _taken(fa: pd.DataFrame, fb: pd.DataFrame, rows: pd.DataFrame, keep: Collection[str]
           ) -> dict[str, Any]:
    """The columns of the pairs ``rows`` names whose label (as the merge names them: a name
    both frames have gets its side's suffix) is in ``keep``, in the merge's order (A's, then
    B's but the key), each taken once as its frame holds it."""
    both = set(fa.columns) & set(fb.columns)
    columns = {}
    for frame, suffix, at in ((fa, "_a", rows.row_a.to_numpy()), (fb, "_b", rows.row_b.to_numpy())):
        for name in frame.columns:
            if frame is fb and name == "match_key":
                continue
            label = name + suffix if name in both and name != "match_key" else name
            if label in keep:
                column = frame[name]
                # the values taken as they are held: text stays Arrow text, categories
                # codes (to_numpy would make a Python object a cell)
                values = (column.array if isinstance(column.dtype, ExtensionDtype)
                          else column.to_numpy())
                columns[label] = values.take(at)
    return columns


class _Taken(dict):
    """Columns of the pairs (the ``held`` ones, and any other taken from the two frames when
    read, :func:`_taken`, not kept): what :func:`timing_columns` reads of a direction, one
    column alive at a time instead of its ~12 (~100 B a pair)."""

    def __init__(self, fa: pd.DataFrame, fb: pd.DataFrame, rows: pd.DataFrame, **held: Any):
        super().__init__(held)
        self.frames = fa, fb, rows

    def __missing__(self, label: str) -> Any:
        return _taken(*self.frames, {label})[label]


def _pairs_frame(fa: pd.DataFrame, fb: pd.DataFrame, rows: pd.DataFrame,
                 keep: Collection[str] = PAIRED) -> pd.DataFrame:
    """The pairs ``rows`` names, as ``fa.merge(fb, on="match_key", suffixes=("_a", "_b"))``
    lays them out, of the frames' types, only the columns ``keep`` names (:func:`_taken`)."""
    # One block per type: a frame made of a dict is consolidated as it is made (adding ~20
    # columns to a frame of a block a column warns of fragmentation).
    return pd.DataFrame(_taken(fa, fb, rows, keep), index=pd.RangeIndex(len(rows)))


def compare_runs(a: Run, b: Run, threshold: float = 0.05) -> Comparison:
    fa, fb = _keyed(a), _keyed(b)
    rows = _paired_rows(fa, fb)
    pairs = _pairs_frame(fa, fb, rows, PAIRED)
    pairs["row_a"], pairs["row_b"] = rows.row_a.to_numpy(), rows.row_b.to_numpy()
    for name in ("verdict", "run_gpu"):  # a few values: codes, the same categories both sides
        sides = [pairs[f"{name}_{s}"] for s in "ab"]  # (compared with each other)
        kinds = pd.CategoricalDtype(sorted(set(sides[0].dropna().unique())
                                           | set(sides[1].dropna().unique())))
        for s, column in zip("ab", sides):
            pairs[f"{name}_{s}"] = column.astype(kinds)
        del sides, column
    pairs["same_kind"] = ((pairs.run_gpu_a == pairs.run_gpu_b) | (pairs.run_gpu_a == "?")
                          | (pairs.run_gpu_b == "?"))
    for d in DIRECTIONS:  # each statistic taken as it is read, then let go
        stats = _Taken(fa, fb, rows, same_kind=pairs.same_kind.to_numpy(),
                       **{f"{d}_median_ms_{s}": pairs[f"{d}_median_ms_{s}"] for s in "ab"})
        for name, column in _timing_columns(stats, d, threshold).items():
            pairs[name] = column
        del stats
    # Accuracy: only between judged verdicts. A case not judged on either side (timed) has no
    # accuracy to compare, so pass -> timed is no change, and no regression.
    judged = (pairs.verdict_a.isin(JUDGED_VERDICTS) & pairs.verdict_b.isin(JUDGED_VERDICTS)
              ).to_numpy()
    for t in TENSORS:  # each tensor's errors taken, set against each other, let go
        errors = _taken(fa, fb, rows, {f"{t}_rel_l2_a", f"{t}_rel_l2_b"})
        ea, eb = float_column(errors[f"{t}_rel_l2_a"]), float_column(errors[f"{t}_rel_l2_b"])
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            pairs[f"{t}_err_ratio"] = np.where(judged & (ea > 0) & (eb >= 0),
                                               eb / np.where(ea > 0, ea, np.nan), np.nan)
        del errors, ea, eb
    ratio_cols = [f"{t}_err_ratio" for t in TENSORS]
    pairs["worst_err_ratio"] = pairs[ratio_cols].max(axis=1, skipna=True) if len(pairs) else []
    # Both ran to the end and one was not judged: they differ in what was checked, not in the
    # outcome (timed -> crash is a change: the case stopped running).
    unjudged = ((pairs.verdict_a.isin(NOT_JUDGED_VERDICTS)
                 | pairs.verdict_b.isin(NOT_JUDGED_VERDICTS))
                & pairs.verdict_a.isin(RAN_VERDICTS) & pairs.verdict_b.isin(RAN_VERDICTS))
    pairs["not_judged"] = unjudged & (pairs.verdict_a != pairs.verdict_b)
    pairs["verdict_changed"] = (pairs.verdict_a != pairs.verdict_b) & ~unjudged
    pairs["verdict_regression"] = pairs.same_kind & (
        ((pairs.verdict_a == "pass") & pairs.verdict_b.isin(BAD_VERDICTS))
        | (pairs.verdict_a.isin(NOT_JUDGED_VERDICTS) & pairs.verdict_b.isin(DIED_VERDICTS)))
    pairs["verdict_change"] = _verdict_changes(pairs.verdict_a, pairs.verdict_b)
    only_a = fa[~fa.match_key.isin(fb.match_key.to_numpy())]
    only_b = fb[~fb.match_key.isin(fa.match_key.to_numpy())]
    warnings = environment_warnings(a, b)
    return Comparison(a=a, b=b, threshold=threshold, pairs=pairs, only_a=only_a, only_b=only_b,
                      differences=differences(a, b, skip=warned_labels(warnings)),
                      warnings=warnings, names_a=fa[list(NAMES["a"])],
                      names_b=fb[list(NAMES["b"])])


def _verdict_changes(va: pd.Series, vb: pd.Series) -> np.ndarray:
    """``pass → fail`` where the verdicts differ, else ``pass``, a pair at a time: one string
    per distinct change, which every pair of it refers to (a Python string a pair, and the
    verdicts read out one pair at a time, were ~70 B a pair)."""
    code_a, seen_a = pd.factorize(va, use_na_sentinel=False)
    code_b, seen_b = pd.factorize(vb, use_na_sentinel=False)
    texts = np.array([f"{verdict_label(x)} → {verdict_label(y)}" if x != y else verdict_label(x)
                      for x in seen_a for y in seen_b] or [""], dtype=object)
    return texts[code_a * len(seen_b) + code_b]  # objects, as a list was: text (pandas' str)


def load_compared(run_dir: Path, jobs: int = 1) -> Run:
    """A run as a comparison reads it: :data:`COMPARED` columns, environments and backend code,
    in one streamed pass, by ``jobs`` processes
    (:func:`~attnbench.report.read.pool.read_run_jobs`)."""
    return read_run_jobs(run_dir, jobs, columns=COMPARED, tallies=False)


def run_facts(run: Run) -> dict[str, str]:
    """What a run is, for telling runs apart: the exact GPU kinds (and their families), the
    driver, CUDA, library versions and commit of its most common environment (the records'
    own, which produced the numbers, before the manifest's, which are the client's), the
    matmul peak its workers measured, and the sweep."""
    m, df = run.manifest, run.frame
    view = representative(run.environments)
    facts = {"GPU": ", ".join(run.gpu_kinds) or "?"}
    families = (sorted(set(df.gpu_family.dropna().unique().astype(str)))
                if "gpu_family" in df else [])
    if families and families != run.gpu_kinds:
        facts["family"] = ", ".join(families)
    for key, name in (("driver_version", "driver"), ("cuda_runtime", "CUDA"), ("cudnn", "cuDNN"),
                      ("nccl", "NCCL")):
        if view.get(key):
            facts[name] = str(view[key])
    attnbench = m.get("attnbench") or _values(df, "env_attnbench")
    if attnbench:
        facts["attnbench"] = str(attnbench)
    for name in ("torch", "triton"):
        value = _values(df, f"env_{name}") or (m.get("versions") or {}).get(name)
        if value:
            facts[name] = str(value)
    for k, v in (m.get("versions") or {}).items():
        if k not in facts and k not in ("commit", "dirty") and v is not None:
            facts[k] = str(v)
    commit = view.get("commit") or (m.get("versions") or {}).get("commit")
    if commit:
        dirty = view.get("dirty", (m.get("versions") or {}).get("dirty"))
        facts["commit"] = str(commit)[:12] + (" (dirty)" if dirty else "")
    peaks = measured_peaks(run)
    if peaks:
        facts["measured matmul peak"] = peaks
    facts["sweep"] = str((m.get("sweep") or {}).get("name", "?"))
    return facts


def _values(df: pd.DataFrame, col: str) -> str:
    # the distinct values made text, not every row's (a Python string a row: ~70 B a case)
    return ", ".join(sorted(set(df[col].dropna().unique().astype(str)))) if col in df else ""


def measured_peaks(run: Run) -> str:
    """The matmul peak the run's workers measured (timing.measured_peak_tflops), median per
    GPU kind and dtype: "bf16 790 TFLOP/s"; "" when no record has it (CPU, older records)."""
    df = run.frame
    if "measured_peak_tflops" not in df or df.measured_peak_tflops.isna().all():
        return ""
    # the three columns read, not a copy of every row that has a peak (~230 B a case)
    rows = df.loc[df.measured_peak_tflops.notna(), ["gpu_kind", "dtype", "measured_peak_tflops"]]
    peaks = rows.groupby([_text(rows.gpu_kind).fillna("?").astype(str),
                          rows.dtype.astype(str)])
    many = rows.gpu_kind.nunique() > 1
    return ", ".join(f"{kind + ' ' if many else ''}{dtype} {value:.0f} TFLOP/s"
                     for (kind, dtype), value in peaks.measured_peak_tflops.median().items())


# Facts not compared as facts: measurements, what restates another fact, and what
# environment_warnings compares between the records' own environments.
NOT_COMPARED = ("family", "measured matmul peak", "driver", "CUDA", "cuDNN", "NCCL", "commit")


def differences(a: Run, b: Run, skip: set[str] = frozenset()) -> list[str]:
    """``name A → B`` for each fact of :func:`run_facts` that differs, except those a warning
    already names (``skip``) and measurements."""
    fa, fb = run_facts(a), run_facts(b)
    out = []
    for k in dict.fromkeys([*fa, *fb]):
        if k in skip or k in NOT_COMPARED:
            continue
        if fa.get(k) != fb.get(k):
            out.append(f"{k} {fa.get(k, '?')} → {fb.get(k, '?')}")
    return out


def environment_warnings(a: Run, b: Run) -> list[str]:
    """``runs differ in torch: 2.13.0 -> 2.14.0``, one line per difference between the runs'
    representative environments (:func:`environment.representative`: the most common one of
    each run, since a run is compared as a whole), and a line for a run whose records of one
    GPU kind come from several environments (the representative does not stand for all)."""
    lines = run_warnings(representative(a.environments), representative(b.environments))
    for name, run in (("A", a), ("B", b)):
        for kind, n in mixed_kinds(run.environments).items():
            lines.append(f"run {name} ({run.run_id}) mixes {n} environments on {kind}: "
                         "compared by its most common one")
    return lines + backend_warnings(a.backend_code, b.backend_code) + options_warnings(a.manifest,
                                                                              b.manifest)


def describe(run: Run) -> str:
    """``run-id (H100-SXM5-80GB (family H100); driver 550.54.15 (CUDA 12.4), CUDA runtime
    12.4, torch 2.5.1, ...; measured bf16 790 TFLOP/s; attnbench 0.1.0)``."""
    f = run_facts(run)
    view = representative(run.environments)
    kind = kind_text(view) if len(run.gpu_kinds) == 1 and view.get("gpu_kind") else f["GPU"]
    software = software_text({k: v for k, v in view.items() if k != "python"})
    parts = [kind, software or f"torch {f.get('torch', '?')}"]
    if f.get("measured matmul peak"):
        parts.append(f"measured {f['measured matmul peak']}")
    parts.append(f"attnbench {f.get('attnbench', '?')}")
    return f"{run.run_id} ({'; '.join(parts)})"


# ------------------------------------------------------------------------------------------
# text summary


def _pct(speed: float) -> str:
    if not math.isfinite(speed) or speed <= 0:
        return "?"
    return f"{(1 / speed - 1) * 100:+.1f}% time"


def ambiguous_reasons(pairs: pd.DataFrame, direction: str) -> dict[str, int]:
    """How many AMBIGUOUS pairs of ``direction`` are so for each kind of reason: "too few
    samples", "too noisy: spread never settled", "too noisy: intervals overlap"."""
    if not len(pairs):
        return {}
    why = pairs.loc[pairs[f"{direction}_class"] == "AMBIGUOUS", f"{direction}_why"]
    kinds = why.map(lambda w: "too few samples" if w.startswith("too few") else
                    NOISY_WHY if "never settled" in w else "too noisy: intervals overlap")
    return {k: int(n) for k, n in kinds.value_counts().items()}


def worst_pair(c: Comparison) -> pd.Series:
    """The pair of the largest error ratio B/A (the first of equals), :meth:`named`."""
    p = c.pairs
    return c.named(p.loc[[p.worst_err_ratio.idxmax()]]).iloc[0]


def _same_family(pairs: pd.DataFrame) -> str:
    """", same family H100" when both kinds of these pairs are of one family."""
    families = set(pairs.gpu_family_a.dropna()) | set(pairs.gpu_family_b.dropna())
    both = pairs.gpu_family_a.notna().all() and pairs.gpu_family_b.notna().all()
    return f", same family {families.pop()}" if both and len(families) == 1 else ""


def summary_text(comps: Sequence[Comparison], index: Path | None = None,
                 fail_on: str = "both") -> str:
    lines: list[str] = []
    for c in comps:
        p = c.pairs
        lines.append(f"A (baseline) = {describe(c.a)}")
        lines.append(f"B            = {describe(c.b)}")
        lines += [f"  warning: {w}" for w in c.warnings]
        if c.differences:
            lines.append("  differs: " + "; ".join(c.differences))
        n_same = int(p.same_kind.sum()) if len(p) else 0
        lines.append(f"  matched {len(p)} case pairs ({n_same} on the same GPU kind, "
                     f"{len(p) - n_same} across GPU kinds); {len(c.only_a)} only in A, "
                     f"{len(c.only_b)} only in B")
        for d in DIRECTIONS:
            counts = p[f"{d}_class"].value_counts() if len(p) else pd.Series(dtype=int)
            text = ", ".join(f"{int(counts[k])} {k}" for k in ("FAST", "SLOW", "SAME", "AMBIGUOUS",
                                                              "RATIO", "n/a") if k in counts)
            whys = ambiguous_reasons(p, d)
            if whys:
                text += " (AMBIGUOUS: " + ", ".join(f"{n} {w}" for w, n in whys.items()) + ")"
            lines.append(f"  timing {d} (threshold {c.threshold:.0%}): {text or 'nothing timed'}")
            cross = p[~p.same_kind & p[f"{d}_speed"].notna()] if len(p) else p
            for (ka, kb), s in (cross.groupby(["run_gpu_a", "run_gpu_b"]) if len(cross) else []):
                lines.append(f"    {kb} / {ka} speed ratio: median {s[f'{d}_speed'].median():.2f}x "
                             f"over {len(s)} cases (ratio only: different GPU kinds"
                             f"{_same_family(s)})")
        changed = p[p.verdict_changed] if len(p) else p
        lines.append(f"  verdicts: {len(changed)} changed" + (
            " (" + ", ".join(f"{n} {k}" for k, n in changed.verdict_change.value_counts().items())
            + ")" if len(changed) else ""))
        unjudged = p[p.not_judged] if len(p) else p
        if len(unjudged):
            lines.append(f"  {len(unjudged)} not compared for accuracy: not judged in A or B "
                         "(timed only, accuracy: false) (" + ", ".join(
                             f"{n} {k}" for k, n in unjudged.verdict_change.value_counts().items())
                         + ")")
        if len(p) and p.worst_err_ratio.notna().any():
            worst = worst_pair(c)
            lines.append(f"  accuracy: error ratio B/A median {p.worst_err_ratio.median():.2f}, "
                         f"worst {worst.worst_err_ratio:.3g}x ({worst.label_b})")
        reg = c.regressions_on(fail_on)
        gate = "" if fail_on == "both" else f", --fail-on {fail_on}"
        if len(reg):
            lines.append(f"  REGRESSIONS ({len(reg)}{gate}):")
            for backend, s in reg.groupby("backend_b"):
                n_slow = int(((s.fwd_class == "SLOW") | (s.bwd_class == "SLOW")).sum())
                n_verdict = int(s.verdict_regression.sum())
                speed = s[[f"{d}_speed" for d in DIRECTIONS]].min(axis=1)
                lines.append(f"    {backend}: {n_slow} slower (median {_pct(speed.median())}), "
                             f"{n_verdict} to a failing verdict")
            for r in reg.head(MAX_LISTED).itertuples():
                what = []
                for d in DIRECTIONS:
                    if getattr(r, f"{d}_class") == "SLOW":
                        what.append(f"SLOW {d} {_pct(getattr(r, f'{d}_speed'))}")
                if r.verdict_regression:
                    what.append(f"{verdict_label(r.verdict_a)} -> {verdict_label(r.verdict_b)}")
                lines.append(f"    {', '.join(what):<34} {r.label_b} [{r.id_b}]")
            if len(reg) > MAX_LISTED:
                lines.append(f"    ... and {len(reg) - MAX_LISTED} more (the dashboard lists all)")
        else:
            lines.append("  no regressions" + (f" (--fail-on {fail_on})" if gate else ""))
        lines.append("")
    if index is not None:
        lines.append(f"dashboard: {index}")
    return "\n".join(lines)


def __getattr__(name: str) -> Any:
    """The timing rule's old home: ``classify`` and ``timing_columns`` are in :mod:`.gate`."""
    moved = {"classify": _classify, "timing_columns": _timing_columns}
    if name in moved:
        warnings.warn(f"{__name__}.{name} moved to attnbench.report.compare.gate.{name}; import "
                      "it from there", DeprecationWarning, stacklevel=2)
        return moved[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
