"""The check's plan: its steps in order, what each should take on a machine, the timeout that
stops it, and the Triton variants the pre-warm compiles (``attnbench gpu-check --plan``).

Estimates come from :mod:`attnbench.gpu_check.costs`; a step's timeout is twice its estimate
plus :data:`TIMEOUT_SLACK_S`, and every timeout is also cut to what is left of the whole
check's budget, so the collection always runs. Variants here are the plan's own torch-free
count (what the kernels specialise on: dtype, padded head dims, feature flags, packing; the
decode kernel also its GQA group, page size and split count); the pre-warm compiles the
variants :func:`attnbench.kernels.warm.variants` names and records them beside these.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from attnbench.gpu_check.costs import (CHILD_START_S, FIRST_TIMED_CASE_S, Machine, case_seconds,
                                       runs_on)
from attnbench.gpu_check.sweeps import CheckSweeps
from attnbench.sweep.case import Case
from attnbench.sweep.options import RunOptions

STEPS = ("probe", "prewarm", "timer", "speed", "accuracy", "collect")
"""In order; every step but ``collect`` runs in its own process under its own timeout."""
BUDGET_S = 540.0
"""The whole check, by default: one command may run 10 minutes on the lent GPU box (600 s);
a minute is left for the interpreter's start and the folder's transfer back."""
TARGET_S = 480.0
"""What the plan's total must stay under on an H200 (issue #24: 8 minutes)."""
TIMEOUT_SLACK_S = 30.0
"""Added to twice a step's estimate: a cold page cache can stretch torch's import that long."""
COLLECT_S = 2.0
"""Reading the journal and the step files back, writing the summary (the driver, no torch)."""
COLLECT_RESERVE_S = 20.0
"""Kept from every step's timeout for the collection, whatever the steps did."""
PROBE_MATMUL = ("bf16", "fp16", "fp32", "tf32")
PROBE_MATMUL_S = 1.0
"""Seconds of matmuls per dtype for the measured peak (measure_matmul_peak's default)."""
PROBE_CASE_S = 0.05
"""Asking PyTorch which SDPA kernel a case gets (allocating its q, k, v once)."""
AUTOTUNE_CONFIGS = {64: 15.0, 128: 28 / 3}
"""Configs an autotuned kernel compiles after pruning, per padded head dim: issue #24 counted
45 (d64) and 28 (d128) over forward + dK/dV + dQ."""
FLASH_BWD_KERNELS = ("bwd_preprocess", "bwd_dkdv", "bwd_dq")
DECODE_KERNELS = ("decode_split", "decode_merge")


@dataclass(frozen=True)
class Step:
    name: str
    what: str
    estimate_s: float
    timeout_s: float


@dataclass
class Variant:
    """One compile-relevant variant: the kernels a group of cases needs, compiled once."""

    label: str
    kernels: list[str]
    cases: int = 0
    compiles: int = 0
    """Kernel compilations under the plan's config mode (pinned: one per kernel)."""


@dataclass
class Plan:
    machine: str
    mode: str
    """``gpu`` or ``cpu``."""
    kernel_configs: str
    budget_s: float
    steps: list[Step]
    variants: list[Variant] = field(default_factory=list)
    case_s: dict[str, float] = field(default_factory=dict)
    """Case id -> the model's seconds for it (its record's ``wall_s`` is the measurement)."""

    @property
    def total_s(self) -> float:
        return sum(s.estimate_s for s in self.steps)

    def step(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)

    def to_dict(self) -> dict:
        return {**asdict(self), "total_s": self.total_s, "target_s": TARGET_S}

    def lines(self) -> list[str]:
        out = [f"attnbench gpu-check plan: {self.machine} ({self.mode}), kernel configs "
               f"{self.kernel_configs}, budget {self.budget_s:.0f} s",
               f"  {'step':<9} {'estimate':>9} {'timeout':>8}  what"]
        for s in self.steps:
            out.append(f"  {s.name:<9} {s.estimate_s:>7.0f} s {s.timeout_s:>6.0f} s  {s.what}")
        verdict = "within" if self.total_s <= TARGET_S else "OVER"
        out.append(f"  {'total':<9} {self.total_s:>7.0f} s {'':>8}  {verdict} the "
                   f"{TARGET_S:.0f} s target")
        kernels = sum(len(v.kernels) for v in self.variants)
        compiles = sum(v.compiles for v in self.variants)
        out.append(f"  Triton: {len(self.variants)} variants, {kernels} kernels, {compiles} "
                   f"compilations ({self.kernel_configs}; target: 1 per kernel)")
        for v in self.variants:
            out.append(f"    {v.label}: {len(v.kernels)} kernel(s) "
                       f"({', '.join(v.kernels)}), {v.compiles} compiled, {v.cases} cases")
        return out


# -- variants ---------------------------------------------------------------------------------


def _padded(dim: int) -> int:
    return max(16, 1 << (dim - 1).bit_length())


def _variant_key(case: Case) -> tuple:
    flags = (case.mask, case.bias != "none", case.dropout > 0, case.softcap > 0)
    dims = (case.dtype, _padded(case.head_dim), _padded(case.head_dim_v))
    if case.decode:  # GROUP, PAGE_SIZE and NUM_SPLITS (from batch x kv heads) are constexprs
        return ("decode", *dims, *flags, case.heads_q // case.heads_kv, case.seqlen_q,
                case.page_size, case.batch * case.heads_kv)
    # MHA compiles apart from GQA (the group size's "equals 1" specialisation is kept), and a
    # forward-only case apart from a forward + backward one, as attnbench.kernels.warm keys them
    group = "mha" if case.heads_q == case.heads_kv else "gqa"
    return ("flash", *dims, *flags, case.is_packed, group, case.backward)


def _label(key: tuple) -> str:
    kind, dtype, d, dv, mask, alibi, dropout, softcap, *rest = key
    words = [kind, dtype, f"d{d}" + (f"/{dv}" if dv != d else ""), mask]
    words += [w for w, on in (("alibi", alibi), ("dropout", dropout), ("softcap", softcap)) if on]
    if kind == "decode":
        group, rows, page, lanes = rest
        words += [f"group{group}", f"q{rows}", f"page{page}", f"{lanes}bh"]
    else:
        packed, group, backward = rest
        words += [group, *(["packed"] if packed else []), "fwd+bwd" if backward else "fwd"]
    return " ".join(words)


def plan_variants(cases: list[Case], kernel_configs: str) -> list[Variant]:
    """The Triton variants of ``cases`` and the compilations each costs."""
    found: dict[tuple, Variant] = {}
    for case in cases:
        if case.backend != "triton":
            continue
        key = _variant_key(case)
        variant = found.setdefault(key, Variant(_label(key), []))
        wanted = (DECODE_KERNELS if case.decode else
                  ("forward", *(FLASH_BWD_KERNELS if case.backward else ())))
        variant.kernels += [k for k in wanted if k not in variant.kernels]
        variant.cases += 1
    for key, variant in found.items():
        per_kernel = 1.0 if kernel_configs == "pinned" else AUTOTUNE_CONFIGS.get(key[2], 28 / 3)
        tuned = [k for k in variant.kernels if k in ("forward", "bwd_dkdv", "bwd_dq")]
        variant.compiles = len(variant.kernels) - len(tuned) + math.ceil(per_kernel * len(tuned))
    return list(found.values())


# -- steps ------------------------------------------------------------------------------------


def _timeout(estimate_s: float) -> float:
    return math.ceil(2 * estimate_s + TIMEOUT_SLACK_S)


def _sweep_step_s(cases: list[Case], options: RunOptions, machine: Machine,
                  timed: bool) -> float:
    first = FIRST_TIMED_CASE_S if (timed and machine.gpu) else 0.0
    return (CHILD_START_S + machine.process_start_s + first
            + sum(case_seconds(c, options, machine) for c in cases))


def make_plan(sweeps: CheckSweeps, machine: Machine, budget_s: float = BUDGET_S) -> Plan:
    speed, accuracy = list(sweeps.speed.cases), list(sweeps.accuracy.cases)
    variants = plan_variants(speed + accuracy, sweeps.kernel_configs)
    sdpa = [c for c in speed + accuracy if c.backend.startswith("sdpa") and runs_on(c, machine)]
    probe_s = (machine.process_start_s + len(sdpa) * PROBE_CASE_S
               + (len(PROBE_MATMUL) * PROBE_MATMUL_S if machine.gpu else 0.0))
    waves = math.ceil(len(variants) / max(1, min(len(variants), machine.cores))) if variants else 0
    slowest = max((v.compiles for v in variants), default=0) * machine.compile_s
    prewarm_s = machine.process_start_s + waves * (machine.process_start_s + slowest)
    if not machine.gpu and variants:
        # The rehearsal: one process per core, each launching its share of the variants'
        # kernels in the interpreter (attnbench.gpu_check.prewarm).
        most = max(len(v.kernels) for v in variants)
        prewarm_s = 2 * machine.process_start_s + waves * most * machine.interpreted_call_s
        waves = 1
    timer_cases = sweeps.timer_cases()
    timer_options = sweeps.options("speed")
    timer_s = 2 * _sweep_step_s(timer_cases, timer_options, machine, timed=True) \
        - (CHILD_START_S + machine.process_start_s)  # one pool serves both modes
    estimates = [
        ("probe", probe_s, "identity (NVML), " + (f"matmul peak ({'/'.join(PROBE_MATMUL)} x "
                                                    f"{PROBE_MATMUL_S:g} s), " if machine.gpu
                                                    else "") +
         f"SDPA's pick for {len(sdpa)} cases, TF32 flags"),
        ("prewarm", prewarm_s, f"{len(variants)} variants in parallel processes "
                               f"(at most {machine.cores} at once: {waves} round(s)), "
                               + (f"{sum(v.compiles for v in variants)} compilations"
                                  if machine.gpu else "rehearsed: launched in the interpreter,"
                                  " nothing compiles")),
        ("timer", timer_s, f"{len(timer_cases)} cases timed eagerly and from a CUDA graph"),
        ("speed", _sweep_step_s(speed, sweeps.options("speed"), machine, timed=True),
         f"{len(speed)} cases timed ({Path(sweeps.speed.path).name}), timing loops at their caps"),
        ("accuracy", _sweep_step_s(accuracy, sweeps.options("accuracy"), machine, timed=False),
         f"{len(accuracy)} cases vs fp64 ({Path(sweeps.accuracy.path).name})"),
        ("collect", COLLECT_S, "summary.json: verdicts, figures, steps vs this plan"),
    ]
    steps = [Step(name, what, round(est, 1), _timeout(est) if name != "collect" else
                  COLLECT_RESERVE_S) for name, est, what in estimates]
    case_s = {c.id: round(case_seconds(c, sweeps.options(role), machine), 2)
              for role in ("speed", "accuracy") for c in sweeps.role(role).cases}
    return Plan(machine=machine.name, mode="gpu" if machine.gpu else "cpu",
                kernel_configs=sweeps.kernel_configs, budget_s=budget_s, steps=steps,
                variants=variants, case_s=case_s)
