"""A run directory as data: its manifest, its records, and one flat pandas row per record.

Columns of :func:`frame` (one row per record)::

    id, label, features, verdict, reason          # from the record
    <every Case field>                            # backend, dtype, seqlen_q, cp, tp, gpu, ...
    world_size, attention_kind                    # derived from the case
    gpu_kind, gpu_family, host, device_name,      # from record.env (kind: the exact SKU)
    env_torch, env_triton, env_attnbench
    flops_fwd, flops_bwd, clock, timing_mode,     # from record.timing
    peak_tflops, measured_peak_tflops
    fwd_median_ms, fwd_q1_ms, fwd_q3_ms, fwd_min_ms, fwd_n, fwd_tflops, fwd_pct_peak,
    fwd_pct_measured_peak, fwd_gbps, fwd_pct_peak_bandwidth, fwd_peak_memory_bytes,
    fwd_noisy (bwd_ too: NaN for a forward-only case, decode)
    <t>_rel_l2, <t>_bound, <t>_ratio, <t>_nonfinite, <t>_over  for t in out, dq, dk, dv
    worst_over                                    # max over tensors of rel_l2 / bound
    fp8_kernel_rel_l2, fp8_quantization_rel_l2,   # fp8 cases' error split (accuracy.fp8,
    fp8_end_to_end_rel_l2, fp8_accumulation_rel_l2  # attnbench.accuracy.fp8_split); NaN otherwise
    compile_mode, compile_variant, compile_s,     # record.compile: Triton compiles of the case,
    compile_kernels, compile_autotune_s,          # apart from the timed figures; None / NaN
    compile_interpreted                           # for records without it
    crash_signal, crash_exit_code
    run_id

Missing values are NaN / None; nothing is invented. Records written before a field existed
(no ``gpu_family``, ``gbps``, ``noisy``, ...) read as unknown: ``<d>_noisy`` is True only where
the record says so.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from attnbench.errors import ReportError  # noqa: F401  (raised here, importers' name)
from attnbench.results.records import IDENTITIES, TENSORS  # IDENTITIES: its home is records

# Heatmap columns besides the tensors: the identities, then CP/TP parity.
CHECK_COLUMNS = IDENTITIES + ("parity",)
from attnbench.sweep.case import CASE_FIELDS, attention_kind


# Columns a dashboard filter may name besides the Case fields (validated without data).
EXTRA_COLUMNS: tuple[str, ...] = (
    "id", "label", "features", "verdict", "reason", "world_size", "attention_kind", "gpu_kind",
    "gpu_family", "host", "device_name", "env_torch", "env_triton", "env_attnbench", "clock",
    "timing_mode", "run_id", "packed", "sequences", "tokens", "compile_mode", "compile_variant",
)
FILTER_COLUMNS: tuple[str, ...] = tuple(CASE_FIELDS) + EXTRA_COLUMNS
TIMING_STATS = ("median_ms", "q1_ms", "q3_ms", "min_ms", "n", "tflops", "pct_peak",
                "pct_measured_peak", "gbps", "pct_peak_bandwidth", "peak_memory_bytes")
DIRECTIONS = ("fwd", "bwd")
PARITY_COLUMNS = ("id", "label", "backend", "dtype", "seqlen_q", "cp", "tp", "cp_algo",
                  "world_size", "features", "verdict", "gpu_kind")
"""The case columns of each parity check's row (:func:`parity_checks`, and the reader's)."""
FP8_SPLIT = ("kernel", "quantization", "end_to_end", "accumulation")


# ------------------------------------------------------------------------------------------
# loading (through attnbench.results.store, which owns the run directory format)


def journal_of(run_dir: Path, *, directory: bool = True) -> Path:
    """``run_dir``'s journal, or :class:`ReportError` (one line) naming what is missing:
    ``run_dir`` itself (when ``directory``), or its ``records.jsonl``."""
    run_dir = Path(run_dir)
    if directory and not run_dir.is_dir():
        raise ReportError(f"{run_dir}: no such run directory")
    path = run_dir / "records.jsonl"
    if not path.exists():
        raise ReportError(f"{path}: no such file; RUN must be a run directory written by "
                          "`attnbench run` (it holds records.jsonl and manifest.json)")
    return path


def load_records(run_dir: Path) -> list[dict[str, Any]]:
    """The run's records (last one per case id; a torn last line is skipped)."""
    from attnbench.errors import RunDirError
    from attnbench.results.store import load_records as store_load_records

    journal_of(run_dir, directory=False)
    try:
        records = store_load_records(Path(run_dir))
    except RunDirError as exc:  # every record checked there (store.check_record)
        raise ReportError(str(exc)) from None
    return records


def load_manifest(run_dir: Path) -> dict[str, Any]:
    """The manifest, or a minimal stand-in (run_id from the directory name) when it is absent:
    a report of records without their manifest is still worth drawing."""
    from attnbench.errors import RunDirError
    from attnbench.results.store import load_manifest as store_load_manifest

    path = Path(run_dir) / "manifest.json"
    if not path.exists():
        return {"run_id": Path(run_dir).resolve().name, "missing": True}
    try:
        manifest = store_load_manifest(Path(run_dir))
    except RunDirError as exc:
        raise ReportError(str(exc)) from None
    if not isinstance(manifest, dict):
        raise ReportError(f"{path}: expected a JSON object, got {type(manifest).__name__}")
    manifest.setdefault("run_id", Path(run_dir).resolve().name)
    return manifest


@dataclass
class Run:
    """One run directory, loaded: a frame row per case (its last record) and what the pages
    read of the records besides it, gathered in the same pass
    (:func:`attnbench.report.read.reader.read_run`); never the records themselves (a run of 10^6 cases is ~7 GB of them)."""

    path: Path
    manifest: dict[str, Any]
    frame: pd.DataFrame = field(repr=False)
    environments: list[Any] = field(default_factory=list, repr=False)
    """:class:`~attnbench.report.read.environment.Environment` s, most records first."""
    backend_code: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    """Backend -> its code (:func:`~attnbench.report.read.code_changes.backend_code`)."""
    series: list[Any] = field(default_factory=list, repr=False)
    """Error-trend series (:func:`~attnbench.report.read.trends.collect_series`)."""
    parity: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)
    """Every parity check, a row each (:func:`parity_checks`)."""
    crashes: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    """Case id -> crash, for the failures the page lists."""
    commonality: list[str] = field(default_factory=list, repr=False)
    """What the failing cases share, a line each
    (:meth:`~attnbench.report.read.commonality.Commonality.lines`)."""

    @property
    def run_id(self) -> str:
        return str(self.manifest.get("run_id") or self.path.name)

    @property
    def sweep_path(self) -> str | None:
        sweep = self.manifest.get("sweep") or {}
        return sweep.get("path") if isinstance(sweep, dict) else None

    @property
    def gpu_kinds(self) -> list[str]:
        devices = self.manifest.get("devices") or []
        kinds = {d.get("gpu_kind") for d in devices if isinstance(d, dict)}
        # the distinct kinds, not every row's value read out (~70 B a case at each call)
        kinds |= set(self.frame["gpu_kind"].dropna().unique()) if len(self.frame) else set()
        return sorted(k for k in kinds if k)


def load_run(run_dir: str | Path) -> Run:
    """The run with every column of :func:`frame` and none of the tallies, its records listed
    while the frame is built: what ``attnbench export`` reads. The report and compare read
    :func:`attnbench.report.read.reader.read_run` (streamed, bounded)."""
    run_dir = Path(run_dir)
    journal_of(run_dir)
    records = load_records(run_dir)
    manifest = load_manifest(run_dir)
    run_id = str(manifest.get("run_id") or run_dir.name)
    return Run(path=run_dir, manifest=manifest, frame=frame(records, run_id))


# ------------------------------------------------------------------------------------------
# records -> frame


def _num(x: Any) -> float:
    if type(x) is float:  # most values (~50 a record, 10^6 records): no call
        return x
    if x is None or isinstance(x, bool):
        return math.nan
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


number = _num
"""A record's value as a float (NaN when absent or not a number), as every column reads it."""


# Column names made once, not per record (10^6 records are flattened by export and report).
_TIMING_COLUMNS = tuple((d, tuple((f"{d}_{s}", s) for s in TIMING_STATS), f"{d}_noisy")
                        for d in DIRECTIONS)
_TENSOR_COLUMNS = tuple((t, f"{t}_rel_l2", f"{t}_bound", f"{t}_ratio", f"{t}_nonfinite",
                         f"{t}_over") for t in TENSORS)
_IDENTITY_COLUMNS = tuple((name, f"{name}_over") for name in IDENTITIES)
_FP8_COLUMNS = tuple((f"fp8_{part}_rel_l2", f"{part}_rel_l2") for part in FP8_SPLIT)
_CASE_KEYS = frozenset(CASE_FIELDS)


def flatten(rec: dict[str, Any], run_id: str = "") -> dict[str, Any]:
    case = rec.get("case") or {}
    if type(case) is dict and case.keys() <= _CASE_KEYS:  # a case as written: copied in C
        row: dict[str, Any] = dict.fromkeys(CASE_FIELDS)
        row.update(case)
    else:
        row = {name: case.get(name) for name in CASE_FIELDS}
    lengths = case.get("seqlens_q")
    packed = isinstance(lengths, list) and bool(lengths)
    for name in ("seqlens_q", "seqlens_kv"):  # hashable cells (groupby, filters)
        row[name] = tuple(row[name]) if isinstance(row[name], list) else row[name]
    cp, tp = case.get("cp") or 1, case.get("tp") or 1
    hq, hkv = case.get("heads_q"), case.get("heads_kv")
    row.update(
        id=rec.get("id", ""),
        label=rec.get("label", ""),
        features=rec.get("features", ""),
        verdict=rec.get("verdict", ""),
        reason=rec.get("reason") or "",
        world_size=int(cp) * int(tp),
        attention_kind=attention_kind(hq, hkv),
        run_id=run_id,
        packed=packed,
        # query tokens of one call: a packed case's seqlen_q is already the pack's total
        sequences=len(lengths) if packed else case.get("batch"),
        tokens=_num(case.get("seqlen_q")) * (1 if packed else _num(case.get("batch"))),
    )
    env = rec.get("env") or {}
    row.update(gpu_kind=env.get("gpu_kind"), gpu_family=env.get("gpu_family"),
               host=env.get("host"), device_name=env.get("device_name"),
               env_torch=env.get("torch"), env_triton=env.get("triton"),
               env_attnbench=env.get("attnbench"))

    timing = rec.get("timing") or {}
    row["clock"] = timing.get("clock")
    row["timing_mode"] = timing.get("mode")
    for key in ("flops_fwd", "flops_bwd", "peak_tflops", "measured_peak_tflops"):
        row[key] = _num(timing.get(key))
    for d, columns, noisy in _TIMING_COLUMNS:
        stats = timing.get(d) or {}
        for column, s in columns:
            v = stats.get(s)
            row[column] = v if type(v) is float else _num(v)
        row[noisy] = stats.get("noisy") is True

    acc = rec.get("accuracy") or {}
    tensors = acc.get("tensors") or {}
    # A case timed with `accuracy: false` has no tensors section, only its NaN/Inf checks.
    counted = {c.get("tensor"): _num(c.get("value")) for c in rec.get("checks") or []
               if isinstance(c, dict) and c.get("check") == "nonfinite"}
    overs = []
    for t, rel_l2, bound_, ratio, nonfinite_, over_ in _TENSOR_COLUMNS:
        m = tensors.get(t) or {}
        rel, bound = _num(m.get("rel_l2")), _num(m.get("bound"))
        row[rel_l2] = rel
        row[bound_] = bound
        row[ratio] = _num(m.get("ratio"))
        row[nonfinite_] = nonfinite = (_num(m.get("nonfinite")) if m
                                       else counted.get(t, math.nan))
        over = rel / bound if bound and bound > 0 and not math.isnan(rel) else math.nan
        if not math.isnan(nonfinite) and nonfinite > 0:
            over = math.inf  # NaN/Inf in a tensor is as wrong as it gets
        row[over_] = over
        overs.append(over)
    # Reference-free checks, as value over bound like the tensors: the identities (they decide
    # where a backend hides its dropout mask) and the worst parity error of a CP/TP split.
    identities = acc.get("identities") or {}
    for name, over_ in _IDENTITY_COLUMNS:
        check = identities.get(name) or {}
        value, bound = _num(check.get("value")), _num(check.get("bound"))
        over = value / bound if bound and bound > 0 and not math.isnan(value) else math.nan
        row[over_] = over
        overs.append(over)
    parity = [(_num(p.get("rel_l2")), _num(p.get("bound")))
              for p in (acc.get("parity") or {}).values() if isinstance(p, dict)]
    parity_over = [v / b for v, b in parity if b and b > 0 and not math.isnan(v)]
    row["parity_over"] = max(parity_over) if parity_over else math.nan
    overs.append(row["parity_over"])
    finite = [o for o in overs if not math.isnan(o)]
    row["worst_over"] = max(finite) if finite else math.nan
    split = acc.get("fp8") if isinstance(acc.get("fp8"), dict) else {}
    for column, key in _FP8_COLUMNS:
        row[column] = _num(split.get(key))

    compiled = rec.get("compile") if isinstance(rec.get("compile"), dict) else {}
    row.update(compile_mode=compiled.get("mode"), compile_variant=compiled.get("variant"),
               compile_s=_num(compiled.get("seconds")),
               compile_kernels=_num(compiled.get("kernels")),
               compile_autotune_s=_num(compiled.get("autotune_s")),
               compile_interpreted=compiled.get("interpreted") is True)

    crash = rec.get("crash") or {}
    row["crash_signal"] = crash.get("signal")
    row["crash_exit_code"] = crash.get("exit_code")
    return row


def frame(records: Iterable[dict[str, Any]], run_id: str = "") -> pd.DataFrame:
    rows = [flatten(r, run_id) for r in records]
    if not rows:
        return pd.DataFrame(columns=list(flatten({"case": {}}, run_id)))
    return pd.DataFrame(rows)


def parity_checks(records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """Every ``check == "parity"`` entry, one row each, with its record's case columns."""
    rows = []
    for rec in records:
        for chk in rec.get("checks") or []:
            if isinstance(chk, dict) and chk.get("check") == "parity":
                base = flatten(rec)
                rows.append({**{k: base[k] for k in PARITY_COLUMNS},
                             "tensor": chk.get("tensor"), "metric": chk.get("metric"),
                             "value": _num(chk.get("value")), "bound": _num(chk.get("bound")),
                             "passed": chk.get("passed")})
    return pd.DataFrame(rows)


def case_key(case: dict[str, Any], ignore: Iterable[str] = ("gpu",)) -> str:
    """The case minus some fields, as a canonical string: how one case is found in two runs."""
    drop = set(ignore)
    return json.dumps({k: v for k, v in sorted(case.items()) if k not in drop},
                      sort_keys=True, separators=(",", ":"))


def apply_filter(df: pd.DataFrame, include: dict[str, list[Any]] | None,
                 exclude: dict[str, list[Any]] | None = None,
                 columns: Iterable[str] | None = None) -> pd.DataFrame:
    """Keep the rows whose column is one of the listed values (``include``), then drop those
    whose column is one of ``exclude``'s. ``columns``: only these columns of those rows (what
    a panel reads: the rows of all ~100 columns are ~0.6 GB at 10^6 rows, issue 29)."""
    mask = pd.Series(True, index=df.index)
    for col, values in (include or {}).items():
        mask &= df[col].isin(values) if col in df else False
    for col, values in (exclude or {}).items():
        if col in df:
            mask &= ~df[col].isin(values)
    if columns is not None:
        df = df[list(dict.fromkeys(columns))]  # whole columns: shared, not copied
    return df[mask]
