"""``attnbench selftest``: the checks catch real bugs and raise no false alarms.

It runs the standard sweep (``sweeps/standard.yaml``) twice over:

* **controls** -- every case of the sweep with its own (correct) backend, plus ``mutant.base``
  (the correct code most mutants edit) on the template backend's cases, and the two correct
  hidden-mask dropouts (torch's RNG; a seed) on its dropout cases: every one must pass
  (``unsupported`` is fine, with its reason);
* **mutants** -- every entry of :mod:`attnbench.mutants.catalogue` on the template backend's
  cases (``naive``'s; mutants that only edit the CP/TP code on its CP/TP cases): every one must
  fail somewhere.

Cases go through the normal path -- Dask, warm rank pools, crash capture -- so a mutant that
crashes or hangs becomes a record, never the end of the selftest (``--executor pools`` skips
Dask but keeps the rank pools). ``--seeds N`` repeats everything with seeds 0..N-1.

The table says, for each bug class, whether it was caught, by which check (reference error,
baseline ratio, identity, parity, determinism, NaN/Inf, crash) and the margin: measured value
over bound for the strongest evidence, best per dtype too. A catch by a margin under
``WEAK_MARGIN`` is marked weak. Exit status: 0 all caught and no false alarm; 1 otherwise;
2 bad input; 3 the cluster failed.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence, TextIO

from attnbench.dtypes import BY_NAME, FAMILIES, is_fp8
from attnbench.errors import (CONTRACT_BREACH, EXIT_BAD_INPUT, EXIT_CLUSTER, EXIT_FAILURES, EXIT_OK,
                              ClusterError)
from attnbench.mutants.catalogue import (CATALOGUE, CONTROL, FUSED_CONTROL,
                                        HIDDEN_DROPOUT_CONTROL, LONG_SEQLEN,
                                        SEEDED_DROPOUT_CONTROL, Mutant, by_name)
from attnbench.report.read.trends import LEVEL_BOUND, SLOPE_BOUND, findings, trends
from attnbench.resources import ENV_DEVICE, ENV_THREADS
from attnbench.results.records import BAD_VERDICTS, DIED_VERDICTS, NOT_RUN_VERDICTS
from attnbench.sweep.case import Case
from attnbench.sweep.load import Sweep, load_sweep
from attnbench.sweep.options import RunOptions, TimingOptions

SWEEPS_DIR = Path(__file__).resolve().parent.parent / "sweeps"
DEFAULT_SWEEPS = (SWEEPS_DIR / "standard.yaml", SWEEPS_DIR / "decode.yaml",
                  SWEEPS_DIR / "fp8.yaml")
"""The standard sweep, and the decode and fp8 sweeps for their bug classes (19-21, 23-24)."""
TEMPLATE = "naive"
"""The backend whose cases the mutants take over (most mutants edit naive's code)."""
WEAK_MARGIN = 2.0
"""A mutant whose best evidence is a measured value under this many times its bound is caught
only by a hair: the table marks it, and the check deserves strengthening."""


# -- which cases -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    controls: tuple[Case, ...]
    mutants: dict[str, tuple[Case, ...]]

    @property
    def cases(self) -> tuple[Case, ...]:
        seen: dict[str, Case] = {}
        for case in (*self.controls, *(c for cases in self.mutants.values() for c in cases)):
            seen.setdefault(case.id, case)
        return tuple(seen.values())


def reseed(cases: Iterable[Case], seeds: int) -> list[Case]:
    """Every case with seeds 0 .. seeds-1 (the sweep's own seed is replaced)."""
    return [c.replace(seed=s) for c in cases for s in range(seeds)]


def make_plan(sweep: Sweep, *, seeds: int = 1, mutants: Sequence[Mutant] = CATALOGUE,
              controls: bool = True, template: str = TEMPLATE) -> Plan:
    cases = reseed(sweep.cases, seeds)
    base = [c for c in cases if c.backend == template]
    if not base:
        raise ValueError(f"{sweep.path}: no {template!r} cases for the mutants to take over")
    short = [c for c in base if not is_long(c)]
    control_cases = (cases + [c.replace(backend=CONTROL) for c in short]
                     + [c.replace(backend=FUSED_CONTROL) for c in short if c.world_size == 1]
                     + [c.replace(backend=HIDDEN_DROPOUT_CONTROL) for c in short
                        if c.world_size == 1 and c.dropout > 0]
                     # a seeded hidden mask replays on CP/TP ranks and in packs too
                     + [c.replace(backend=SEEDED_DROPOUT_CONTROL) for c in short
                        if c.dropout > 0 and not c.decode and not is_fp8(c.dtype)]
                     ) if controls else []
    chosen: dict[str, tuple[Case, ...]] = {}
    for mutant in mutants:
        # A mutant that edits only the CP/TP code is the correct backend on one device; the
        # long cases (seconds each) go only to mutants whose error grows with length.
        if mutant.decode or mutant.parallel or mutant.fp8:
            # Decode mutants take the decode cases, fp8 mutants the fp8 cases, CP/TP mutants
            # the CP/TP cases.
            pool = [c for c in base if (c.decode if mutant.decode else is_fp8(c.dtype)
                                        if mutant.fp8 else c.world_size > 1)]
        else:
            pool = [c for c in (base if mutant.long else short) if not c.decode
                    and not is_fp8(c.dtype)
                    and (c.world_size == 1 or not (mutant.long or mutant.single))]
        if mutant.dropout:
            pool = [c for c in pool if c.dropout > 0]
        chosen[mutant.name] = tuple(c.replace(backend=mutant.name) for c in pool)
    return Plan(controls=tuple(control_cases), mutants=chosen)


def combined(sweeps: Sequence[Sweep]) -> Sweep:
    """One sweep of the cases of several (each case once), with the first one's options."""
    cases = {c.id: c for sweep in sweeps for c in sweep.cases}
    return dataclasses.replace(sweeps[0], cases=tuple(cases.values()),
                               path=", ".join(s.path for s in sweeps))


def is_long(case: Case) -> bool:
    return max(case.seqlen_q, case.seqlen_kv) >= LONG_SEQLEN


# -- running them ----------------------------------------------------------------------------------


def run_with_dask(sweep: Sweep, run_dir: Path, *, scheduler: Optional[str] = None,
                  workers: Optional[int] = None, stream: TextIO = sys.stderr) -> list[dict]:
    """The normal path: a run directory, Dask, rank pools. Resumes a run directory."""
    from attnbench.cluster.connect import connect
    from attnbench.dispatch.run import run_pending
    from attnbench.results.store import RunStore, load_records

    store = RunStore(run_dir, sweep, command=sys.argv)
    try:
        if store.pending():
            conn = connect(scheduler, workers)
            try:
                print(f"attnbench selftest: {len(store.pending())} cases on {conn.where}",
                      file=stream)
                run_pending(store, conn, stream=stream, quiet=True)
            finally:
                conn.close()
    finally:
        store.close()
    return load_records(run_dir)


def run_in_pools(cases: Sequence[Case], options: RunOptions, *,
                 stream: TextIO = sys.stderr) -> list[dict]:
    """Rank pools without Dask (one case at a time): crashes and hangs still become records."""
    from attnbench.cluster.task import CASE_FUNC, outcome_to_record
    from attnbench.execution.pool import RankPool

    pools: dict[int, RankPool] = {}
    records = []
    start = last = time.perf_counter()
    try:
        for i, case in enumerate(cases, 1):
            pool = pools.get(case.world_size)
            if pool is None:
                pool = pools[case.world_size] = RankPool(
                    case.world_size, threads=1, preload=[CASE_FUNC.split(":")[0]])
            t0 = time.perf_counter()
            outcome = pool.run(CASE_FUNC, {"case": case.to_dict(), "options": options.to_dict()},
                               timeout=options.timeout_s)
            records.append(outcome_to_record(case, outcome, time.perf_counter() - t0, 1,
                                             options.timeout_s))
            if time.perf_counter() - last > 10 or i == len(cases):
                last = time.perf_counter()
                print(f"[{i}/{len(cases)}] {last - start:.0f}s elapsed", file=stream, flush=True)
    finally:
        for pool in pools.values():
            pool.close()
    return records


# -- reading the records ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Evidence:
    """The strongest reason one record failed."""

    margin: float
    """Measured value over bound; inf for NaN/Inf, determinism and crashes."""
    check: str
    """reference | baseline_ratio | identity | parity | determinism | nonfinite | crash |
    trend (the error grows with length faster than the baseline's)"""
    tensor: str
    detail: str = ""

    @property
    def label(self) -> str:
        return f"{self.check} {self.tensor}".strip()

    def margin_text(self) -> str:
        if self.check == "crash":
            return self.tensor  # the verdict: error, crash, timeout, ...
        if self.check == "nonfinite":
            return "NaN/Inf"
        if self.check == "determinism":
            return f"{self.detail} bits"
        if self.check == "trend":
            return f"{self.margin:.3g}x slope"
        return f"{self.margin:.3g}x"


def evidence(record: dict) -> Optional[Evidence]:
    """None when the record is not a failure (pass, unsupported, skipped)."""
    verdict = record["verdict"]
    if verdict == "error" and str(record.get("reason", "")).startswith(CONTRACT_BREACH):
        return Evidence(math.inf, "contract", verdict)  # what it returned is not the case's
    if verdict in DIED_VERDICTS:
        return Evidence(math.inf, "crash", verdict)
    if verdict != "fail":
        return None
    best: Optional[Evidence] = None
    for c in record.get("checks") or []:
        if c["passed"]:
            continue
        value, bound = c.get("value"), c.get("bound")
        if c["check"] == "determinism":
            found = Evidence(math.inf, "determinism", c["tensor"], str(int(value or 0)))
        elif c["check"] == "nonfinite" or value is None:
            found = Evidence(math.inf, "nonfinite", c["tensor"])
        else:
            found = Evidence(value / bound if bound else math.inf, c["check"], c["tensor"])
        if best is None or _rank(found) > _rank(best):
            best = found
    return best or Evidence(math.inf, "fail", "", record.get("reason", ""))


def _rank(e: Evidence) -> tuple:
    # A measured margin is the most informative evidence; categorical ones (NaN, bits, crash)
    # are certain but say nothing about how close a check came.
    categorical = {"nonfinite": 3, "determinism": 2, "crash": 1}
    return (e.margin, categorical.get(e.check, 4))


def _best(evidences: Iterable[Evidence]) -> Optional[Evidence]:
    """Finite margins first (the largest), then NaN/Inf, determinism, crash."""
    items = list(evidences)
    finite = [e for e in items if math.isfinite(e.margin)]
    if finite:
        return max(finite, key=lambda e: e.margin)
    order = {"nonfinite": 0, "determinism": 1, "fail": 2, "crash": 3}
    return min(items, key=lambda e: order.get(e.check, 9)) if items else None


@dataclass
class MutantResult:
    mutant: Mutant
    run: int = 0
    failed: int = 0
    unsupported: int = 0
    best: Optional[Evidence] = None
    by_dtype: dict[str, Evidence] = field(default_factory=dict)
    checks: collections.Counter = field(default_factory=collections.Counter)
    """How many failing cases each kind of check caught."""

    trends: list = field(default_factory=list)
    """Error-trend findings on this mutant's series (:mod:`attnbench.report.read.trends`)."""

    @property
    def caught(self) -> bool:
        return self.failed > 0 or bool(self.trends)

    @property
    def weak(self) -> bool:
        return (self.caught and self.best is not None and math.isfinite(self.best.margin)
                and self.best.margin < WEAK_MARGIN and self.best.check != "crash")


def judge_mutant(mutant: Mutant, records: Sequence[dict]) -> MutantResult:
    result = MutantResult(mutant)
    per_dtype: dict[str, list[Evidence]] = collections.defaultdict(list)
    everything = []
    for r in records:
        result.run += 1
        if r["verdict"] in NOT_RUN_VERDICTS:
            result.unsupported += 1
        found = evidence(r)
        if found is None:
            continue
        result.failed += 1
        everything.append(found)
        per_dtype[_dtype_column(r["case"]["dtype"])].append(found)
        kinds = {c["check"] for c in r.get("checks") or [] if not c["passed"]}
        for kind in (kinds or {found.check}):
            result.checks[kind] += 1
    result.trends = findings(records)
    for trend in result.trends:
        # A finding's margin: how far its slope (or a declared tensor's level) is over the bound.
        found = (Evidence(trend.slope / SLOPE_BOUND, "trend", trend.series.tensor) if trend.grows
                 else Evidence(trend.level / LEVEL_BOUND, "level", trend.series.tensor))
        everything.append(found)
        per_dtype[dict(trend.series.key).get("dtype", "?")].append(found)
        result.checks["trend"] += 1
    result.best = _best(everything)
    result.by_dtype = {d: _best(items) for d, items in per_dtype.items()}
    return result


@dataclass
class ControlResult:
    backend: str
    verdicts: collections.Counter = field(default_factory=collections.Counter)
    false_alarms: list[dict] = field(default_factory=list)
    closest: Optional[tuple[float, str, str]] = None
    """(value / bound, check, case label) of the passing check nearest its bound."""
    trend_alarms: list = field(default_factory=list)
    """Error-trend findings on a correct backend's series: false alarms too."""
    steepest: Optional[tuple[float, str]] = None
    """(slope / SLOPE_BOUND, series) of the steepest trend that was no finding."""
    level_findings: list = field(default_factory=list)
    """Tensors the backend declares computed in the input dtype, over LEVEL_BOUND times a
    fused kernel's error or growing faster than it: measured, so true, and shown -- not false
    alarms (PyTorch's CPU flash backward, docs/findings.md)."""


def _declared_by_a_kernel(trend) -> bool:
    """A trend on a tensor the backend declares computed in the input dtype (not naive's own):
    like its level, its growth is that kernel's measured precision (PyTorch's CPU flash dQ
    grows 1.21x per doubling from 512 to 8192 keys), shown as a finding, not a false alarm."""
    return trend.series.declared and trend.series.backend != "naive"


def judge_controls(records: Sequence[dict]) -> dict[str, ControlResult]:
    out: dict[str, ControlResult] = {}
    for trend in trends(records):
        res = out.setdefault(trend.series.backend, ControlResult(trend.series.backend))
        if trend.grows and not _declared_by_a_kernel(trend):
            res.trend_alarms.append(trend)
        elif trend.finding:
            res.level_findings.append(trend)
        elif res.steepest is None or trend.slope / SLOPE_BOUND > res.steepest[0]:
            res.steepest = (trend.slope / SLOPE_BOUND,
                            f"{trend.series.tensor} of {trend.series.label}")
    for r in records:
        backend = r["case"]["backend"]
        res = out.setdefault(backend, ControlResult(backend))
        res.verdicts[r["verdict"]] += 1
        if r["verdict"] in BAD_VERDICTS:
            res.false_alarms.append(r)
            continue
        for c in r.get("checks") or []:
            if c["passed"] and c.get("bound") and c.get("value") is not None:
                ratio = c["value"] / c["bound"]
                if res.closest is None or ratio > res.closest[0]:
                    res.closest = (ratio, f"{c['check']} {c['tensor']}", r["label"])
    return out


# -- the table -------------------------------------------------------------------------------------


def _dtype_column(dtype: str) -> str:
    """The table's column of a dtype: its family (e4m3 and e5m2 share one, fp8)."""
    return BY_NAME[dtype].family


def render(results: Sequence[MutantResult], controls: dict[str, ControlResult]) -> str:
    lines = ["Mutants (each must be caught):",
             f"{'#':<6}{'mutant':<31} {'caught':<8}{'strongest check':<22}{'margin':>11}"
             + "".join(f"{d:>12}" for d in FAMILIES) + f"{'failed/run':>12}  bug class"]
    for res in results:
        m = res.mutant
        caught = ("WEAK" if res.weak else "yes") if res.caught else "MISSED"
        best = res.best
        cells = "".join(f"{(res.by_dtype[d].margin_text() if d in res.by_dtype else '-'):>12}"
                        for d in FAMILIES)
        lines.append(f"{m.number:<6}{m.name.removeprefix('mutant.'):<31} {caught:<8}"
                     f"{(best.label if best else '-'):<22}"
                     f"{(best.margin_text() if best else '-'):>11}{cells}"
                     f"{res.failed:>7}/{res.run:<4}  {m.bug}")
    lines.append("  margin: measured value / bound of the strongest failing check (NaN/Inf: "
                 "non-finite output; bits: elements that differ between backward calls).")
    lines.append("")
    lines.append("Correct backends (each must pass; unsupported is allowed, with its reason):")
    lines.append(f"{'backend':<20}{'cases':>7}{'pass':>7}{'unsupp.':>9}{'bad':>6}"
                 f"  {'closest to a bound (value/bound, check)':<40}")
    for backend in sorted(controls):
        res = controls[backend]
        total = sum(res.verdicts.values())
        near = (f"{res.closest[0]:.2f} {res.closest[1]}" if res.closest else "-")
        lines.append(f"{backend:<20}{total:>7}{res.verdicts['pass']:>7}"
                     f"{res.verdicts['unsupported'] + res.verdicts['skipped']:>9}"
                     f"{len(res.false_alarms):>6}  {near}")
        for r in res.false_alarms[:10]:
            lines.append(f"    FALSE ALARM {r['verdict']}: {r['label']}: {r['reason'][:200]}")
        for trend in res.trend_alarms[:5]:
            lines.append(f"    FALSE ALARM trend: {trend.describe()}")
        if res.level_findings:
            worst = max(res.level_findings, key=lambda t: t.level)
            lines.append(f"    {len(res.level_findings)} findings (declared input precision, "
                         f"not alarms), the largest: {worst.describe()}")
            for trend in [t for t in res.level_findings if t.grows][:3]:
                lines.append(f"    growing (declared input precision, not an alarm): "
                             f"{trend.describe()}")
        if res.steepest:
            lines.append(f"    steepest error trend: {res.steepest[0]:.2f} of the bound "
                         f"({res.steepest[1]})")
    return "\n".join(lines)


def summary(results: Sequence[MutantResult],
            controls: dict[str, ControlResult]) -> tuple[bool, str]:
    missed = [r.mutant.name for r in results if not r.caught]
    weak = [r.mutant.name for r in results if r.weak]
    alarms = sum(len(c.false_alarms) + len(c.trend_alarms) for c in controls.values())
    n_controls = sum(sum(c.verdicts.values()) for c in controls.values())
    ok = not missed and alarms == 0
    text = (f"attnbench selftest: {len(results) - len(missed)}/{len(results)} mutants caught"
            + (f" (missed: {', '.join(missed)})" if missed else "")
            + (f", {len(weak)} only by a hair ({', '.join(weak)})" if weak else "")
            + f"; {alarms} false alarms in {n_controls} control cases"
            + ("" if ok else " -- FAILED"))
    return ok, text


# -- command line ----------------------------------------------------------------------------------


def add_selftest_command(subparsers) -> None:
    p = subparsers.add_parser(
        "selftest", help="run the catalogue of known attention bugs through the standard "
                         "sweep's checks: every bug must be caught, every correct backend pass")
    p.add_argument("--sweep", action="append", metavar="SWEEP",
                   help="a sweep whose checks are tested (repeatable; default: "
                        "sweeps/standard.yaml, sweeps/decode.yaml and sweeps/fp8.yaml)")
    p.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="run every case with seeds 0..N-1 (default 1)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where cases run (default: the GPUs if any, else the CPU)")
    p.add_argument("--mutant", action="append", metavar="NAME",
                   help="only this mutant (repeatable; default: the whole catalogue)")
    p.add_argument("--no-controls", action="store_true",
                   help="skip the correct backends (false-alarm half)")
    p.add_argument("--executor", choices=("dask", "pools"), default="dask",
                   help="dask: the normal path (default); pools: rank pools without Dask")
    p.add_argument("--out", help="run directory for the records (default "
                                 "results/selftest-<UTC time>); an existing one is resumed")
    p.add_argument("--scheduler", help="address of a running Dask scheduler")
    p.add_argument("--workers", type=int, help="concurrent cases on the embedded cluster")
    p.set_defaults(func=cmd_selftest)


def _choose_device(device: str) -> Optional[str]:
    """Set the environment the rank processes inherit; None, or why it cannot be done."""
    from attnbench.cluster.worker import detect_gpus

    gpus = detect_gpus()
    if device == "cuda" and not gpus:
        return "--device cuda: no CUDA device is visible"
    if device == "cpu" or not gpus:
        os.environ[ENV_DEVICE] = "cpu"
        os.environ.setdefault("TRITON_INTERPRET", "1")  # our kernels on CPU: the interpreter
    return None


def cmd_selftest(args: argparse.Namespace) -> int:
    from attnbench.backends import check_backend_name
    from attnbench.results.store import default_run_dir

    if args.seeds < 1:
        print("attnbench: error: --seeds: expected >= 1", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        mutants = [by_name(n if n.startswith("mutant.") else f"mutant.{n}")
                   for n in args.mutant] if args.mutant else list(CATALOGUE)
    except KeyError as exc:
        print(f"attnbench: error: --mutant: {exc.args[0]}", file=sys.stderr)
        return EXIT_BAD_INPUT
    # Accuracy only, many small cases: one torch thread per rank. Two threads per rank on a
    # busy 2-core machine ran the selftest ~10x slower (OpenMP threads waiting on each other).
    os.environ.setdefault(ENV_THREADS, "1")
    problem = _choose_device(args.device)  # before anything starts a rank process
    if problem:
        print(f"attnbench: error: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    sweep = combined([load_sweep(path, check_backend_name)
                      for path in (args.sweep or [str(p) for p in DEFAULT_SWEEPS])])
    try:
        plan = make_plan(sweep, seeds=args.seeds, mutants=mutants,
                         controls=not args.no_controls)
    except ValueError as exc:
        print(f"attnbench: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    # Accuracy only: timing is not what the selftest is about.
    options = dataclasses.replace(sweep.options, timing=TimingOptions(enabled=False))
    selftest_sweep = dataclasses.replace(
        sweep, name="selftest", cases=plan.cases, options=options,
        description=f"selftest of {sweep.path}: {len(mutants)} mutants, seeds {args.seeds}")
    print(f"attnbench selftest: {len(plan.controls)} control cases, "
          f"{sum(len(c) for c in plan.mutants.values())} mutant cases "
          f"({len(mutants)} mutants) from {sweep.path}, seeds 0..{args.seeds - 1}",
          file=sys.stderr)
    t0 = time.perf_counter()
    if args.executor == "pools":
        records = run_in_pools(plan.cases, options)
        run_dir = None
    else:
        run_dir = Path(args.out) if args.out else default_run_dir(selftest_sweep)
        try:
            records = run_with_dask(selftest_sweep, run_dir, scheduler=args.scheduler,
                                    workers=args.workers)
        except ClusterError as exc:
            print(f"attnbench: error: {exc}", file=sys.stderr)
            return EXIT_CLUSTER
    by_backend: dict[str, list[dict]] = collections.defaultdict(list)
    for r in records:
        by_backend[r["case"]["backend"]].append(r)
    mutant_names = {m.name for m in mutants}
    results = [judge_mutant(m, by_backend.get(m.name, [])) for m in mutants]
    controls = judge_controls([r for r in records if r["case"]["backend"] not in mutant_names])
    print(render(results, controls))
    ok, text = summary(results, controls)
    print(text + f" ({time.perf_counter() - t0:.0f} s"
          + (f"; records in {run_dir}/" if run_dir else "") + ")")
    return EXIT_OK if ok else EXIT_FAILURES
