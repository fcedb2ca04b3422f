"""Sweep files and the cases they expand to.

A sweep file (YAML) names defaults, axes that are crossed, and exclusions::

    name: smoke
    defaults: {batch: 1, heads_q: 8, head_dim: 64, dtype: bf16, seed: 0}
    axes:
      backend: [naive, sdpa]
      seqlen_q: [128, 256]
      mask: [none, causal, {window: 64}]
    exclude:
      - {bias: alibi, dropout: 0.1}

Every mistake is reported as ``FILE: FIELD: what was given, what is allowed`` through
:class:`SweepError`; the CLI turns it into exit status 2 without a traceback.

A :class:`Case` is frozen and hashable: it is what travels to a Dask worker and back, and its
:attr:`Case.id` (a hash of its content) is how a rerun finds what is already done.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional

import yaml

from attnbench.errors import SweepError

DTYPES = ("fp32", "fp16", "bf16")
DTYPE_ALIASES = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}
MASKS = ("none", "causal", "window")
BIASES = ("none", "alibi")
INPUTS = ("normal", "large_logits", "outliers")
CP_ALGOS = ("ring", "zigzag", "allgather")


@dataclass(frozen=True, kw_only=True, slots=True)
class Case:
    """Everything that defines one measurement. Shapes follow (batch, heads, seqlen, head_dim)."""

    backend: str
    """Registered backend name, or ``module:object`` for a third-party backend."""
    batch: int = 1
    seqlen_q: int = 128
    seqlen_kv: int = 0
    """0 means "same as seqlen_q" (resolved by :func:`make_case`)."""
    heads_q: int = 8
    heads_kv: int = 0
    """0 means "same as heads_q". heads_kv == heads_q is MHA, 1 is MQA, between is GQA."""
    head_dim: int = 64
    head_dim_v: int = 0
    """0 means "same as head_dim"."""
    mask: str = "none"
    """none | causal | window. Causal masks are aligned bottom-right when seqlen_q != seqlen_kv:
    query i sits at key position i + seqlen_kv - seqlen_q (the flash-attn >= 2.1 convention)."""
    window_left: int = -1
    """For mask=window: how many keys before the aligned diagonal a query sees (-1: unbounded)."""
    window_right: int = -1
    """For mask=window: how many keys after the aligned diagonal a query sees (-1: unbounded)."""
    bias: str = "none"
    """none | alibi (per-query-head geometric slopes, bias = -slope * |i_aligned - j|)."""
    dropout: float = 0.0
    softcap: float = 0.0
    """0 disables; otherwise scores become softcap * tanh(scores / softcap) before the bias."""
    dtype: str = "bf16"
    cp: int = 1
    cp_algo: str = "ring"
    tp: int = 1
    gpu: str = "any"
    inputs: str = "normal"
    seed: int = 0

    # -- derived ----------------------------------------------------------------------------
    @property
    def id(self) -> str:
        payload = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    @property
    def world_size(self) -> int:
        return self.cp * self.tp

    @property
    def attention_kind(self) -> str:
        if self.heads_kv == self.heads_q:
            return "MHA"
        return "MQA" if self.heads_kv == 1 else "GQA"

    @property
    def window_bounds(self) -> tuple[int, int]:
        """(left, right) keys visible around the aligned diagonal, -1 = unbounded; causal is
        (-1, 0). One place for this mapping (flops, AttnSpec)."""
        if self.mask == "none":
            return -1, -1
        if self.mask == "causal":
            return -1, 0
        return self.window_left, self.window_right

    @property
    def mask_label(self) -> str:
        if self.mask != "window":
            return self.mask
        left = "inf" if self.window_left < 0 else str(self.window_left)
        right = "inf" if self.window_right < 0 else str(self.window_right)
        return f"window({left},{right})"

    @property
    def features(self) -> str:
        """A short feature string used to group cases in tables and plots."""
        parts = [self.attention_kind, self.mask_label]
        if self.bias != "none":
            parts.append(self.bias)
        if self.dropout:
            parts.append(f"dropout{self.dropout:g}")
        if self.softcap:
            parts.append(f"softcap{self.softcap:g}")
        if self.cp > 1:
            parts.append(f"cp{self.cp}-{self.cp_algo}")
        if self.tp > 1:
            parts.append(f"tp{self.tp}")
        if self.inputs != "normal":
            parts.append(self.inputs)
        return " ".join(parts)

    @property
    def label(self) -> str:
        return (
            f"{self.backend} {self.dtype} b{self.batch} s{self.seqlen_q}/{self.seqlen_kv} "
            f"h{self.heads_q}/{self.heads_kv} d{self.head_dim}"
            + (f"/{self.head_dim_v}" if self.head_dim_v != self.head_dim else "")
            + f" {self.features} seed{self.seed}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Case":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def replace(self, **changes: Any) -> "Case":
        return dataclasses.replace(self, **changes)


CASE_FIELDS = tuple(f.name for f in fields(Case))
_CASE_DEFAULTS = {f.name: f.default for f in fields(Case)}
_INT_FIELDS = ("batch", "seqlen_q", "seqlen_kv", "heads_q", "heads_kv", "head_dim", "head_dim_v",
               "cp", "tp", "seed")
_POSITIVE_FIELDS = ("batch", "seqlen_q", "seqlen_kv", "heads_q", "heads_kv", "head_dim",
                    "head_dim_v", "cp", "tp")


@dataclass(frozen=True, kw_only=True, slots=True)
class TimingOptions:
    """How each case is timed (see :mod:`attnbench.timing`)."""

    enabled: bool = True
    warmup: int = 2
    """Untimed calls before sampling, at least (compilation, allocator, caches)."""
    warmup_ms: float = field(default=25.0, metadata={"minimum": 0.0})
    """...and at least this much measured time in those calls (GPU clocks ramp up; do_bench's
    default). CPU correctness sweeps set 0."""
    min_sample_ms: float = field(default=0.1, metadata={"minimum": 0.0})
    """A call shorter than this is repeated within one sample (``calls_per_sample``), so a
    sample is not mostly event resolution and launch latency. 0 = always one call."""
    mode: str = field(default="eager", metadata={"choices": ("eager", "graph")})
    """eager: the backend's calls as a user makes them; graph: captured once into a CUDA graph
    and replayed (no host launch overhead; falls back to eager, with a note, when a backend
    cannot be captured)."""
    min_samples: int = 5
    max_samples: int = 100
    target_rel_iqr: float = 0.05
    """Stop sampling once (q3 - q1) / median falls under this."""
    max_seconds: float = 1.0
    """Time cap per direction (forward, backward) per case."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunOptions:
    """Harness options from a sweep's ``options:`` section; not part of any case id."""

    timeout_s: float = 300.0
    """A case that has not answered after this many seconds is recorded as ``timeout``."""
    accuracy: bool = True
    timing: TimingOptions = field(default_factory=TimingOptions)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunOptions":
        data = dict(data)
        timing = TimingOptions(**data.pop("timing", {}))
        return cls(timing=timing, **data)


@dataclass(frozen=True, kw_only=True, slots=True)
class Sweep:
    name: str
    path: str
    cases: tuple[Case, ...]
    options: RunOptions
    source: str
    """The sweep file's text, kept in the run manifest."""
    description: str = ""

    @property
    def digest(self) -> str:
        return hashlib.sha256("\n".join(c.id for c in self.cases).encode()).hexdigest()[:12]


# --------------------------------------------------------------------------------------------
# validation of single values


def _fail(where: str, given: Any, allowed: str) -> SweepError:
    return SweepError(f"{where}: got {given!r}, expected {allowed}")


def _norm_mask(where: str, value: Any) -> dict[str, Any]:
    """Turn ``none`` / ``causal`` / ``{window: W}`` / ``{window: [L, R]}`` into case fields.

    ``{window: W}`` is a causal sliding window of W keys: the query's own position and the W-1
    before it (Mistral-style local attention). ``{window: [L, R]}`` is flash-attn's
    ``window_size=(L, R)``: L keys before and R after the aligned diagonal, -1 for unbounded.
    """
    allowed = "one of none, causal, {window: W} or {window: [left, right]}"
    if isinstance(value, str) and value in ("none", "causal"):
        return {"mask": value, "window_left": -1, "window_right": -1}
    if isinstance(value, Mapping) and set(value) == {"window"}:
        w = value["window"]
        if _is_int(w) and w >= 1:
            return {"mask": "window", "window_left": w - 1, "window_right": 0}
        if (isinstance(w, (list, tuple)) and len(w) == 2 and all(_is_int(x) and x >= -1 for x in w)
                and not (w[0] == -1 and w[1] == -1)):
            return {"mask": "window", "window_left": int(w[0]), "window_right": int(w[1])}
        raise _fail(f"{where}.window", w, "a positive int W, or [left, right] with ints >= -1 "
                    "(-1 = unbounded, not both)")
    raise _fail(where, value, allowed)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _norm_value(where: str, name: str, value: Any, backend_check) -> dict[str, Any]:
    """Validate one field value; return the case fields it sets (mask sets three)."""
    if name == "mask":
        return _norm_mask(where, value)
    if name in _INT_FIELDS:
        if not _is_int(value):
            raise _fail(where, value, "an integer")
        if name in _POSITIVE_FIELDS and value <= 0:
            raise _fail(where, value, "a positive integer")
        return {name: value}
    if name == "dropout":
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value < 1.0:
            raise _fail(where, value, "a number in [0, 1)")
        return {name: float(value)}
    if name == "softcap":
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise _fail(where, value, "a number >= 0 (0 disables softcap)")
        return {name: float(value)}
    if name == "dtype":
        v = DTYPE_ALIASES.get(value, value) if isinstance(value, str) else value
        if v not in DTYPES:
            raise _fail(where, value, "one of " + ", ".join(DTYPES))
        return {name: v}
    choices = {"bias": BIASES, "inputs": INPUTS, "cp_algo": CP_ALGOS}.get(name)
    if choices is not None:
        if value not in choices:
            raise _fail(where, value, "one of " + ", ".join(choices))
        return {name: value}
    if name == "gpu":
        if not isinstance(value, str) or not value:
            raise _fail(where, value, "a GPU kind such as H100, A100, cpu, or any")
        return {name: value}
    if name == "backend":
        if not isinstance(value, str) or not value:
            raise _fail(where, value, "a backend name")
        problem = backend_check(value)
        if problem:
            raise SweepError(f"{where}: {problem}")
        return {name: value}
    raise AssertionError(name)  # every Case field is handled above


def _check_field_name(where: str, name: Any) -> None:
    if name not in CASE_FIELDS or name in ("window_left", "window_right"):
        public = [f for f in CASE_FIELDS if f not in ("window_left", "window_right")]
        raise SweepError(f"{where}: unknown field {name!r}, expected one of {', '.join(public)}")


# --------------------------------------------------------------------------------------------
# whole sweeps

_TOP_KEYS = ("name", "description", "defaults", "axes", "exclude", "include", "options")


def make_case(where: str, values: Mapping[str, Any]) -> Case:
    """Build a case from resolved field values, filling the 0 = "same as" defaults and checking
    relations between fields."""
    v = dict(values)
    if "backend" not in v:
        raise SweepError(f"{where}: backend: missing; give it in defaults or axes")
    for name, same_as in (("seqlen_kv", "seqlen_q"), ("heads_kv", "heads_q"),
                          ("head_dim_v", "head_dim")):
        if not v.get(name):
            v[name] = v.get(same_as, _CASE_DEFAULTS[same_as])
    case = Case(**v)
    if case.heads_q % case.heads_kv:
        raise SweepError(f"{where}: heads_kv: got {case.heads_kv}, expected a divisor of "
                         f"heads_q={case.heads_q} (GQA groups must be whole)")
    return case


BackendCheck = Callable[[str], Optional[str]]
"""name -> None if the backend name can be resolved, else why not (the CLI passes
:func:`attnbench.backends.check_backend_name`; this module knows no registry)."""


def load_sweep(path: str | Path, backend_check: Optional[BackendCheck] = None) -> Sweep:
    """Read, validate and expand a sweep file. Raises :class:`SweepError` with a user-ready
    message (``FILE: FIELD: ...``) on any mistake. ``backend_check`` validates backend names
    (default: any non-empty name)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SweepError(f"{path}: cannot read sweep file: {exc.strerror or exc}") from None
    return parse_sweep(text, str(path), backend_check)


def parse_sweep(text: str, filename: str, backend_check: Optional[BackendCheck] = None) -> Sweep:
    if backend_check is None:
        backend_check = _any_backend
    try:
        data = yaml.safe_load(text)  # data only: no tags that construct objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        problem = getattr(exc, "problem", None) or str(exc)
        raise SweepError(f"{filename}: malformed YAML at {where}: {problem}") from None
    if not isinstance(data, Mapping):
        raise SweepError(f"{filename}: expected a mapping with keys {', '.join(_TOP_KEYS)}, "
                         f"got {type(data).__name__}")
    for key in data:
        if key not in _TOP_KEYS:
            raise SweepError(f"{filename}: {key}: unknown key, expected one of {', '.join(_TOP_KEYS)}")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip() or "/" in name:
        raise _located(filename, _fail("name", name, "a non-empty string without '/'"))

    def section(key: str, kind: type, default):
        value = data.get(key, default)
        if value is None:
            value = default
        if not isinstance(value, kind):
            raise SweepError(f"{filename}: {key}: got {type(value).__name__}, expected a "
                             f"{'mapping' if kind is Mapping else 'list'}")
        return value

    defaults_raw = section("defaults", Mapping, {})
    axes_raw = section("axes", Mapping, {})
    exclude_raw = section("exclude", list, [])
    include_raw = section("include", list, [])
    options = _parse_options(filename, section("options", Mapping, {}))

    try:
        defaults: dict[str, Any] = {}
        for key, value in defaults_raw.items():
            _check_field_name(f"defaults.{key}", key)
            defaults.update(_norm_value(f"defaults.{key}", key, value, backend_check))

        axes: list[tuple[str, list[dict[str, Any]]]] = []
        for key, values in axes_raw.items():
            _check_field_name(f"axes.{key}", key)
            if not isinstance(values, list) or not values:
                raise _fail(f"axes.{key}", values, "a non-empty list of values")
            axes.append((key, [_norm_value(f"axes.{key}[{i}]", key, v, backend_check)
                               for i, v in enumerate(values)]))

        excludes = [_parse_partial(f"exclude[{i}]", e, backend_check)
                    for i, e in enumerate(exclude_raw)]
        includes = [_parse_partial(f"include[{i}]", e, backend_check)
                    for i, e in enumerate(include_raw)]

        cases: list[Case] = []
        seen: set[str] = set()

        def add(where: str, values: dict[str, Any]) -> None:
            case = make_case(where, values)
            if case.id not in seen:
                seen.add(case.id)
                cases.append(case)

        names = [k for k, _ in axes]
        for combo in itertools.product(*(vals for _, vals in axes)):
            values = dict(defaults)
            for part in combo:
                values.update(part)
            if any(_matches(values, ex) for ex in excludes):
                continue
            where = "axes(" + ", ".join(f"{n}={_show(values, n)}" for n in names) + ")"
            add(where, values)
        for i, inc in enumerate(includes):
            add(f"include[{i}]", {**defaults, **inc})
    except SweepError as exc:
        raise _located(filename, exc) from None

    if not cases:
        raise SweepError(f"{filename}: axes: the sweep expands to no cases (everything excluded?)")
    desc = data.get("description") or ""
    return Sweep(name=name, path=filename, cases=tuple(cases), options=options, source=text,
                 description=str(desc))


def _any_backend(name: str) -> Optional[str]:
    return None


def _show(values: Mapping[str, Any], name: str) -> str:
    if name == "mask":
        return Case(backend="x", **{k: values[k] for k in ("mask", "window_left", "window_right")
                                    if k in values}).mask_label
    return str(values.get(name))


def _located(filename: str, exc: SweepError) -> SweepError:
    return SweepError(f"{filename}: {exc}")


def _parse_partial(where: str, entry: Any, backend_check) -> dict[str, Any]:
    if not isinstance(entry, Mapping) or not entry:
        raise _fail(where, entry, "a mapping of field: value")
    out: dict[str, Any] = {}
    for key, value in entry.items():
        _check_field_name(f"{where}.{key}", key)
        out.update(_norm_value(f"{where}.{key}", key, value, backend_check))
    return out


def _matches(values: Mapping[str, Any], partial: Mapping[str, Any]) -> bool:
    return all(values.get(k) == v for k, v in partial.items())


def _parse_options(filename: str, raw: Mapping[str, Any]) -> RunOptions:
    known = {f.name: f for f in fields(RunOptions)}
    timing_known = {f.name: f for f in fields(TimingOptions)}
    clean: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in known:
            raise SweepError(f"{filename}: options.{key}: unknown option, expected one of "
                             f"{', '.join(known)}")
        if key == "timing":
            if not isinstance(value, Mapping):
                raise SweepError(f"{filename}: options.timing: got {value!r}, expected a mapping")
            timing: dict[str, Any] = {}
            for tkey, tval in value.items():
                if tkey not in timing_known:
                    raise SweepError(f"{filename}: options.timing.{tkey}: unknown option, expected "
                                     f"one of {', '.join(timing_known)}")
                timing[tkey] = _check_option(filename, f"options.timing.{tkey}",
                                             timing_known[tkey], tval)
            clean["timing"] = timing
        else:
            clean[key] = _check_option(filename, f"options.{key}", known[key], value)
    return RunOptions.from_dict(clean)


def _check_option(filename: str, where: str, spec: dataclasses.Field, value: Any) -> Any:
    default = spec.default
    choices = spec.metadata.get("choices")
    if choices is not None:
        if value not in choices:
            raise SweepError(f"{filename}: {where}: got {value!r}, expected one of "
                             f"{', '.join(choices)}")
        return value
    minimum = spec.metadata.get("minimum")
    if minimum is not None:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < minimum:
            raise SweepError(f"{filename}: {where}: got {value!r}, expected a number >= "
                             f"{minimum:g}")
        return float(value)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise SweepError(f"{filename}: {where}: got {value!r}, expected true or false")
        return value
    if isinstance(default, int):
        if not _is_int(value) or value < 0:
            raise SweepError(f"{filename}: {where}: got {value!r}, expected an integer >= 0")
        return value
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise SweepError(f"{filename}: {where}: got {value!r}, expected a positive number")
    return float(value)


def single_case_sweep(sweep: Sweep, case_ids: Iterable[str]) -> Sweep:
    """The sweep restricted to some case ids (``attnbench run SWEEP --case ID``)."""
    wanted = list(case_ids)
    by_id = {c.id: c for c in sweep.cases}
    chosen = []
    for cid in wanted:
        matches = [c for i, c in by_id.items() if i.startswith(cid)]
        if len(matches) != 1:
            raise SweepError(f"{sweep.path}: --case {cid}: "
                             f"{'no case' if not matches else 'several cases'} with that id prefix "
                             f"(the sweep has {len(by_id)} cases; `attnbench validate --list` shows ids)")
        chosen.append(matches[0])
    return dataclasses.replace(sweep, cases=tuple(chosen))
