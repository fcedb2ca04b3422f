"""Harness options of a sweep (its ``options:`` section): how cases are timed and judged.

Not part of any case id. Every option goes through the rule in its field's metadata
(:mod:`attnbench.validation`), in a sweep file and in a stored manifest alike; a mistake is
``FILE: options.FIELD: got X, expected Y`` (:class:`~attnbench.errors.SweepError`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Optional

from attnbench.errors import shown_key as _key
from attnbench.resources import KERNEL_CONFIG_MODES
from attnbench.validation import Choice, Flag, Int, PowerOfTwo, Problems, Real, unknown_name
from attnbench.validation import fail as _fail


FLOOR_CAP = 10
"""Below ``min_samples`` sampling stops only once the calls themselves (the clock's own time:
CPU time with ``cpu_clock: cpu``) have taken ``FLOOR_CAP`` x ``max_seconds``, or the wall clock
:data:`FLOOR_WALL_CAP` x ``max_seconds``: the floor holds on a loaded box, yet a call of seconds
cannot run on for min_samples calls (the case's ``timeout_s`` bounds a hung one)."""
FLOOR_WALL_CAP = 60
"""Wall time runs ~20x the CPU time of a rank at load 8 on 2 cores (a 20 ms forward, 13
samples in 5 s of wall time): a cap on wall time alone cut the floor short there."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TimingOptions:
    """How each case is timed (see :mod:`attnbench.timing.loop`)."""

    enabled: bool = field(default=True, metadata={"rule": Flag()})
    warmup: int = field(default=2, metadata={"rule": Int(0, 10_000)})
    """Untimed calls before sampling, at least (compilation, allocator, caches). The warm-up
    loop stops at 10,000 calls whatever ``warmup_ms`` says (timing.measure)."""
    warmup_ms: float = field(default=25.0, metadata={"rule": Real(0.0, 60_000.0)})
    """...and at least this much measured time in those calls (GPU clocks ramp up; do_bench's
    default). CPU correctness sweeps set 0."""
    min_sample_ms: float = field(default=0.1, metadata={"rule": Real(0.0, 10_000.0)})
    """On a GPU: a call shorter than this is repeated within one sample (``calls_per_sample``),
    so a sample is not mostly event resolution and launch latency. 0 = always one call."""
    cpu_min_sample_ms: float = field(default=2.0, metadata={"rule": Real(0.0, 10_000.0)})
    """The same on a CPU device (ignored on a GPU): a sample is a block of calls that lasts at
    least this long (sized from the warm-up). Sub-millisecond calls one a sample spread wide on
    a shared box (IQR / median 52 % p95 at load 8 on 2 cores; blocks of 2 ms: 28 %,
    benchmarks/speed_gate.py). 0 = one call."""
    mode: str = field(default="eager", metadata={"rule": Choice(("eager", "graph"))})
    """eager: the backend's calls as a user makes them; graph: captured once into a CUDA graph
    and replayed (no host launch overhead; falls back to eager, with a note, when a backend
    cannot be captured)."""
    min_samples: int = field(default=5, metadata={"rule": Int(0, 10_000)})
    """A floor: ``max_seconds`` does not stop sampling below it (only calls so slow that the
    floor would take :data:`FLOOR_CAP` x ``max_seconds`` do)."""
    max_samples: int = field(default=100, metadata={"rule": Int(1, 10_000)})
    """At most 10,000: every sample is kept in the record (``samples_ms``)."""
    target_rel_iqr: float = field(default=0.05, metadata={"rule": Real(0.0, 100.0,
                                                                        lo_open=True)})
    """Stop sampling once (q3 - q1) / median falls under this."""
    max_seconds: float = field(default=1.0, metadata={"rule": Real(0.0, 3600.0, lo_open=True)})
    """Time cap per direction (forward, backward) per case."""
    cpu_clock: str = field(default="wall", metadata={"rule": Choice(("wall", "cpu"))})
    """On a CPU device (ignored on a GPU): ``wall``, the latency a user sees
    (``time.perf_counter``); ``cpu``, the CPU time of the rank process (``time.process_time``):
    the work done, which other processes on a shared box do not stretch -- what makes
    ``attnbench compare --fail-on speed`` reliable there (docs/compare.md), not a latency."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunOptions:
    """Harness options from a sweep's ``options:`` section; not part of any case id."""

    timeout_s: float = field(default=300.0, metadata={"rule": Real(
        0.0, 7 * 86400.0, lo_open=True, expected=f"a positive number <= {7 * 86400} (a week)")})
    """A case that has not answered after this many seconds is recorded as ``timeout``."""
    accuracy: bool = field(default=True, metadata={"rule": Flag()})
    kernel_configs: str = field(default="autotune", metadata={"rule": Choice(KERNEL_CONFIG_MODES)})
    """Our Triton kernels' tiles: ``autotune`` over each kernel's space, or ``pinned``, one
    config per kernel and head-dim class (compiles one kernel per variant: a fresh GPU's first
    minutes). The case runner sets ATTNBENCH_KERNEL_CONFIGS from it; records say which ran."""
    fp8_max_imprecise_acc: int = field(default=0, metadata={"rule": PowerOfTwo(256)})
    """fp8 forward of our Triton kernel on sm_90: every this many products the tensor cores'
    partial sum is added into the fp32 accumulator (tl.dot's max_num_imprecise_acc, capped at
    each dot's K; below 32, one wgmma's K, it acts as 32). 0: Triton's default, which never
    promotes on sm_90. The older, run-wide spelling of the case field ``fp8_promotion``: it
    becomes the promotion of every fp8 case that names none when the sweep is read."""
    timing: TimingOptions = field(default_factory=TimingOptions)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunOptions":
        data = dict(data)
        timing = TimingOptions(**data.pop("timing", {}))
        return cls(timing=timing, **data)


def parse_options(filename: str, raw: Mapping[str, Any],
                  problems: Optional[Problems] = None) -> RunOptions:
    """Every option through its field's rule (``metadata["rule"]``); each mistake into
    ``problems`` (or raised at once, ``FILE: options...``, without it)."""
    own = problems is None
    problems = Problems(filename) if own else problems
    clean: dict[str, Any] = {}
    for key, value in raw.items():
        with problems.check():
            clean.update(_check_option("options", key, value, RunOptions, problems))
    if own:
        problems.raise_any()
    options = RunOptions()
    with problems.check():
        options = RunOptions.from_dict(clean)
        if options.timing.min_samples > options.timing.max_samples:
            raise _fail("options.timing.min_samples", options.timing.min_samples,
                        f"at most max_samples={options.timing.max_samples}")
    if own:
        problems.raise_any()
    return options


def _check_option(where: str, key: Any, value: Any, kind: type, problems: Problems) -> dict:
    known = {f.name: f for f in fields(kind)}
    if key not in known:
        raise unknown_name(f"{where}.{_key(key)}", key, list(known), "option")
    if known[key].metadata.get("rule") is not None:
        return {key: known[key].metadata["rule"].check(f"{where}.{key}", value)}
    if not isinstance(value, Mapping):  # a nested section (timing)
        raise _fail(f"{where}.{key}", value, "a mapping")
    nested: dict[str, Any] = {}
    for k, v in value.items():
        with problems.check():
            nested.update(_check_option(f"{where}.{key}", k, v, TimingOptions, problems))
    return {key: nested}


def check_options_dict(where: str, data: Any) -> RunOptions:
    """Options as stored (a manifest's ``options``), through the same rules as a sweep's."""
    if not isinstance(data, Mapping):
        raise _fail(where, data, "a JSON object of options")
    return parse_options(where, data)
