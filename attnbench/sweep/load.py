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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import attnbench.sweep.axes as axes
from attnbench.dtypes import ALIASES, FP8_WGMMA_K, is_fp8
from attnbench.errors import SweepError, short_repr
from attnbench.errors import shown_key as _key
from attnbench.sweep.case import (CASE_RULES, MAX_CASES, MAX_NAME, MAX_SIZE, PUBLIC_FIELDS,
                                  _PACKED_FIELDS, Case, make_case)
from attnbench.sweep.length_mix import expand as expand_lengths
from attnbench.sweep.one_pass import Doubt, SharedCauses, valid_part
from attnbench.sweep.options import RunOptions
from attnbench.sweep.options import parse_options as _parse_options
from attnbench.sweep.packed_rules import MAX_SEQUENCES, defaults_for
from attnbench.validation import Name, Problems, near_miss, unknown_name
from attnbench.validation import fail as _fail
from attnbench.validation import is_int as _is_int
from attnbench.validation import load_yaml, read_input_file


@dataclass(frozen=True, kw_only=True, slots=True)
class Sweep:
    name: str
    path: str
    cases: tuple[Case, ...]
    options: RunOptions
    source: str
    """The sweep file's text, kept in the run manifest."""
    description: str = ""
    overrides: tuple[str, ...] = ()
    """The ``-s FIELD=VALUE`` overrides it was read with (kept in the run manifest)."""
    selected: tuple[str, ...] = ()
    """Ids of the cases to run now (``--case``); empty: every case. The run directory, its
    manifest and :attr:`digest` are always the whole sweep's."""

    @property
    def digest(self) -> str:
        return hashlib.sha256("\n".join(c.id for c in self.cases).encode()).hexdigest()[:12]


# --------------------------------------------------------------------------------------------
# validation of single values


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
        if _is_int(w) and 1 <= w <= MAX_SIZE:
            return {"mask": "window", "window_left": w - 1, "window_right": 0}
        if (isinstance(w, (list, tuple)) and len(w) == 2
                and all(_is_int(x) and -1 <= x <= MAX_SIZE for x in w)
                and not (w[0] == -1 and w[1] == -1)):
            return {"mask": "window", "window_left": int(w[0]), "window_right": int(w[1])}
        raise _fail(f"{where}.window", w, f"a positive int W <= {MAX_SIZE}, or [left, right] "
                    "with ints >= -1 (-1 = unbounded, not both)")
    raise _fail(where, value, allowed + _mask_hint(value))


_MASK_WORDS = {"none": "none", "causal": "causal", "window": "{window: W}"}


def _mask_hint(value: Any) -> str:
    """`` (did you mean causal?)`` for ``casual``, ``{window: W}`` for ``windw`` or a mapping
    with the key ``windwo``: the one suggestion rule, over the words a mask is spelt with."""
    if isinstance(value, Mapping) and len(value) == 1:
        value = next(iter(value))
    close = near_miss(value, tuple(_MASK_WORDS))
    return f" (did you mean {_MASK_WORDS[close]}?)" if close else ""


def _norm_value(where: str, name: str, value: Any, backend_check) -> dict[str, Any]:
    """Validate one field value; return the case fields it sets (mask sets three)."""
    if name == "mask":
        return _norm_mask(where, value)
    if name == "varlen":
        return {"seqlens_q": expand_lengths(where, value, MAX_SEQUENCES, MAX_SIZE)}
    if name == "dtype" and isinstance(value, str):
        value = ALIASES.get(value, value)
    value = CASE_RULES[name].check(where, value)
    if name == "backend":
        problem = backend_check(value)
        if problem:
            raise SweepError(f"{where}: {problem}")
    return {name: value}


def _check_field_name(where: str, name: Any) -> None:
    if name not in PUBLIC_FIELDS:
        raise unknown_name(where, name, PUBLIC_FIELDS, "field")


# --------------------------------------------------------------------------------------------
# whole sweeps

_TOP_KEYS = ("name", "description", "defaults", "axes", "exclude", "include", "options")
_NAME = Name(r"[A-Za-z0-9][A-Za-z0-9._+-]*", "a non-empty string of letters, digits, '.', '_', "
             "'+' or '-' (it names the run directory)", limit=MAX_NAME)



BackendCheck = Callable[[str], Optional[str]]
"""name -> None if the backend name can be resolved, else why not (the CLI passes
:func:`attnbench.backends.check_backend_name`; this module knows no registry)."""


def load_sweep(path: str | Path, backend_check: Optional[BackendCheck] = None,
               overrides: Sequence[str] = ()) -> Sweep:
    """Read, validate and expand a sweep file, with ``-s FIELD=VALUE`` ``overrides``
    (:mod:`attnbench.sweep.axes`). Raises :class:`SweepError` with every mistake, one line
    each (``FILE: FIELD: ...``). ``backend_check`` validates backend names (default: any
    non-empty name)."""
    return parse_sweep(read_input_file(path, "sweep file"), str(path), backend_check, overrides)


def parse_sweep(text: str, filename: str, backend_check: Optional[BackendCheck] = None,
                overrides: Sequence[str] = ()) -> Sweep:
    check = backend_check or _any_backend
    data = load_yaml(text, filename)
    if not isinstance(data, Mapping):
        raise SweepError(f"{filename}: expected a mapping with keys {', '.join(_TOP_KEYS)}, "
                         f"got {type(data).__name__}")
    problems = Problems(filename)
    doubt = Doubt()  # what the field mistakes leave unknown: the cases are checked all the same
    fixed, paths = axes.split_overrides(overrides, PUBLIC_FIELDS, problems)
    doubt.blind = bool(problems)
    data = axes.set_paths(data, paths)
    problems.overridden = {".".join(parts) for parts, _ in paths}
    for key in data:
        if key not in _TOP_KEYS:
            problems.add(unknown_name(_key(key), key, _TOP_KEYS, "key"))
            doubt.blind |= near_miss(key, _TOP_KEYS) not in _HARMLESS_KEYS  # a misspelt axes?
    name = description = ""
    with problems.check():
        name = _NAME.check("name", data.get("name"))
    with problems.check():
        description = data.get("description") or ""
        if not isinstance(description, str):
            raise _fail("description", description, "a string")

    def section(key: str, kind: type, default):
        value = data.get(key, default)
        if value is None:
            return default
        if not isinstance(value, kind):
            problems.add(SweepError(f"{key}: got {type(value).__name__}, expected a "
                                    f"{'mapping' if kind is Mapping else 'list'}"))
            doubt.blind |= key not in _HARMLESS_KEYS
            return default
        return value

    def norm(where: str, field_name: str, value: Any) -> dict[str, Any]:
        return _norm_value(where, field_name, value, check)

    defaults_raw, axes_raw = section("defaults", Mapping, {}), section("axes", Mapping, {})
    exclude_raw, include_raw = section("exclude", list, []), section("include", list, [])
    defaults: dict[str, Any] = {}
    for key, value in defaults_raw.items():
        try:
            _check_field_name(f"defaults.{_key(key)}", key)
            if key not in fixed:  # -s FIELD=... replaces its default too
                defaults.update(norm(f"defaults.{key}", key, value))
        except SweepError as exc:
            problems.add(exc)
            if key in PUBLIC_FIELDS:
                doubt.fields.add(_SETS.get(key, key))
            else:
                doubt.misspelt(key, PUBLIC_FIELDS)
    before = problems.count
    forced = axes.read_overrides(fixed, CASE_RULES, norm, problems, MAX_CASES)
    doubt.blind |= set(fixed) != set(forced)  # a -s field none of whose values can be read
    if problems.count > before:
        doubt.shaky |= set(fixed)
    total, product = axes.count_points(axes_raw, PUBLIC_FIELDS, CASE_RULES, MAX_CASES, forced)
    if total + len(include_raw) > MAX_CASES:
        count = f"{total + len(include_raw):,}" if total < 10**12 else f"{total:.2e}"
        problems.add(SweepError(f"axes: {product}"
                                f"{f' + {len(include_raw)} include' if include_raw else ''} = "
                                f"{count} cases, more than the {MAX_CASES:,} one sweep may have; "
                                "split it into several sweep files"))
        problems.raise_any()  # before anything is expanded
    before = problems.count
    groups = axes.read_axes(axes_raw, PUBLIC_FIELDS, CASE_RULES, norm, problems, MAX_CASES, forced)
    if problems.count > before:
        _doubt_axes(doubt, axes_raw, groups, forced)
    excludes, includes = [], []
    for i, entry in enumerate(exclude_raw):
        try:
            excludes.append((i, _parse_partial(f"exclude[{i}]", entry, norm)))
        except SweepError as exc:
            problems.add(exc)
            doubt.excludes.append(valid_part(entry, norm, _check_field_name))
    for i, entry in enumerate(include_raw):
        with problems.check():
            includes.append(_parse_partial(f"include[{i}]", entry, norm))
    options = _parse_options("", section("options", Mapping, {}), problems)
    if doubt.blind:
        problems.raise_any()

    excludes = [(i, ex) for i, ex in excludes if axes.reachable(ex, forced)]
    doubt.shaky |= doubt.fields
    empty = any(not g.rows for g in groups)  # every value of an axis was wrong: no product

    def make(where: str, values: dict[str, Any]) -> Optional[Case]:
        if doubt.skips(values):
            return None
        try:
            return make_case(where, values)
        except SweepError as exc:
            if doubt.holds_back(values, str(exc).removeprefix(f"{where}: ")):
                return None
            raise

    def doubtful(exclude: Mapping[str, Any]) -> bool:
        return bool(problems) and (empty or bool(set(exclude) & doubt.shaky))

    cases = axes.expand(groups, defaults, excludes, exclude_raw,
                        axes.cross_includes(includes, forced), make, _show, problems,
                        defaults_for, doubtful, SharedCauses())
    problems.raise_any()
    if not cases:
        raise SweepError(f"{filename}: axes: the sweep expands to no cases (everything excluded?)")
    if options.fp8_max_imprecise_acc:
        cases = _with_run_promotion(cases, options.fp8_max_imprecise_acc)
    return Sweep(name=name, path=filename, cases=tuple(cases), options=options, source=text,
                 description=description, overrides=tuple(overrides))


_HARMLESS_KEYS = ("name", "description", "options")
"""Top-level keys whose mistakes leave the cases as the sweep meant them."""
_SETS = {"varlen": "seqlens_q"}
"""The case field a sweep field sets when it is spelt differently (a case has no ``varlen``)."""


def _doubt_axes(doubt: Doubt, axes_raw: Mapping, groups: Sequence[axes.AxisGroup],
                forced: Mapping[str, list]) -> None:
    """After mistakes in the axes: the fields of an axis left out whole take their default
    (unknown), so do those a misspelt axis key probably meant, and an axis that lost a wrong
    value is shaky (an exclude may have matched only that value)."""
    made = {n: g for g in groups for n in g.fields}
    for key, raw in axes_raw.items():
        zipped = raw.get(axes.ZIP) if isinstance(raw, Mapping) and key not in PUBLIC_FIELDS \
            else None
        columns = dict(zipped) if isinstance(zipped, Mapping) else {key: raw}
        for name, column in columns.items():
            if name not in PUBLIC_FIELDS:
                doubt.misspelt(name, PUBLIC_FIELDS)
            elif name not in made:
                doubt.fields.add(_SETS.get(name, name))
            elif name in forced or (len(made[name].rows) != axes.count_values(
                    column, CASE_RULES, name, MAX_CASES)):
                doubt.shaky.update(made[name].fields)


def _with_run_promotion(cases, promotion: int) -> list[Case]:
    """The older run-wide option ``fp8_max_imprecise_acc``: the promotion of every fp8 case that
    names none (``fp8_promotion``), so that the case, its id and its record say what ran (below
    one wgmma's K it always acted as that K)."""
    promotion = max(promotion, FP8_WGMMA_K)
    return [c.replace(fp8_promotion=promotion) if is_fp8(c.dtype) and not c.fp8_promotion
            else c for c in cases]


def _any_backend(name: str) -> Optional[str]:
    return None


def _show(values: Mapping[str, Any], name: str) -> str:
    if name == "mask":
        return Case(backend="x", **{k: values[k] for k in ("mask", "window_left", "window_right")
                                    if k in values}).mask_label
    if name == "varlen":
        return short_repr(list(values.get("seqlens_q", ())))
    return short_repr(values.get(name)) if name in _PACKED_FIELDS else str(values.get(name))


def _parse_partial(where: str, entry: Any, norm) -> dict[str, Any]:
    if not isinstance(entry, Mapping) or not entry:
        raise _fail(where, entry, "a mapping of field: value")
    out: dict[str, Any] = {}
    for key, value in entry.items():
        _check_field_name(f"{where}.{_key(key)}", key)
        out.update(norm(f"{where}.{key}", key, value))
    return out




def single_case_sweep(sweep: Sweep, case_ids: Iterable[str]) -> Sweep:
    """The sweep with some of its cases chosen (``attnbench run SWEEP --case ID``): its run
    directory is the whole sweep's, only the chosen cases run (again, if they are done)."""
    wanted = list(case_ids)
    by_id = {c.id: c for c in sweep.cases}
    chosen = []
    for cid in wanted:
        matches = [c for i, c in by_id.items() if i.startswith(cid)] if cid else []
        if len(matches) != 1:
            raise SweepError(f"{sweep.path}: --case {short_repr(cid)}: "
                             f"{'no case' if not matches else 'several cases'} with that id prefix "
                             f"(the sweep has {len(by_id)} cases; `attnbench validate --list` "
                             "shows ids)")
        chosen.append(matches[0].id)
    return dataclasses.replace(sweep, selected=tuple(dict.fromkeys(chosen)))
