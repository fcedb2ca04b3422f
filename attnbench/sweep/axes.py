"""The axes of a sweep: plain lists, ranges, zipped groups, and ``-s`` overrides.

An axis is a list of values (``seqlen_q: [128, 256]``), a range of integers
(``seqlen_q: {pow2: [512, 131072]}``, ``seed: {range: [0, 9]}``, ``{range: [start, stop, step]}``,
both ends included), or a zipped group: fields whose values vary together, one point per column
of the group, under a label of your choice::

    axes:
      backend: [triton, sdpa_flash]
      tokens:                                    # batch x seqlen_q = 16384 tokens
        zip: {seqlen_q: {pow2: [512, 16384]}, batch: {pow2: [32, 1]}}

Groups are crossed with each other like plain axes; a group expands to as many points as each of
its columns has values. Every range is counted before it is expanded (at most ``limit`` values).

``-s FIELD=VALUE`` on the command line makes FIELD take exactly VALUE (a YAML value: ``1024``,
``[fp32, bf16]``, ``{pow2: [512, 4096]}``) in every case: its axis is replaced (in a zipped group,
the points whose FIELD is among the values are kept), its default dropped, each include crossed
with the values, and an exclude naming another value of FIELD dropped (it can no longer match).
``-s options.timeout_s=60``, ``-s options.timing.max_seconds=0.1``, ``-s name=...`` set the
sweep file's own keys.

This module knows no field by name: the case fields, their rules and how a value becomes case
fields are handed to it (:mod:`attnbench.sweep`), so a new field gets ranges, zips and overrides
without a line here.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from attnbench.errors import SweepError, short_repr, shown_key
from attnbench.validation import Int, Problems, fail, is_int, load_yaml, unknown_name

RANGE_KINDS = ("pow2", "range")
ZIP = "zip"
MAX_OVERRIDE_CHARS = 10_000
"""Characters of one ``-s`` value: a command line, not a file."""

Normalize = Callable[[str, str, Any], dict]
"""(where, field, value) -> the case fields the value sets (``mask`` sets three); raises
:class:`SweepError`."""


@dataclass(frozen=True, slots=True)
class AxisGroup:
    """One axis of the product: a plain axis (one field) or a zipped group (several)."""

    where: str
    """``axes.seqlen_q`` or ``axes.tokens``: how messages name it."""
    fields: tuple[str, ...]
    rows: tuple[dict, ...]
    """One mapping of case fields per point of the axis, normalized."""


# -- ranges ------------------------------------------------------------------------------------

def is_range(value: Any) -> bool:
    return isinstance(value, Mapping) and len(value) == 1 and next(iter(value)) in RANGE_KINDS


def range_values(where: str, spec: Mapping, rule: Any, limit: int) -> list[int]:
    """``{pow2: [lo, hi]}`` (powers of two from lo to hi; hi < lo counts down) or
    ``{range: [start, stop]}`` / ``{range: [start, stop, step]}`` (stop included when reached),
    counted before they are expanded: at most ``limit`` values."""
    ((kind, bounds),) = spec.items()
    where = f"{where}.{kind}"
    if not isinstance(rule, Int):
        raise fail(where, dict(spec), "a list of values (ranges are for integer fields)")
    if kind == "pow2":
        if not (isinstance(bounds, list) and len(bounds) == 2
                and all(is_int(b) and b >= 1 and b & (b - 1) == 0 for b in bounds)):
            raise fail(where, bounds, "[first, last], both powers of two, e.g. [512, 131072]")
        lo, hi = (b.bit_length() - 1 for b in bounds)
        exponents = range(lo, hi + 1) if lo <= hi else range(lo, hi - 1, -1)
        return [1 << e for e in exponents]
    if not (isinstance(bounds, list) and len(bounds) in (2, 3) and all(map(is_int, bounds))
            and (len(bounds) == 2 or bounds[2] != 0)):
        raise fail(where, bounds, "[start, stop] or [start, stop, step] of integers, step != 0 "
                                  "(stop included)")
    start, stop = bounds[0], bounds[1]
    step = bounds[2] if len(bounds) == 3 else (1 if stop >= start else -1)
    count = max(0, (stop - start) // step + 1)
    if count == 0:
        raise fail(where, bounds, f"a step that goes from {start} towards {stop}")
    if count > limit:
        raise fail(where, bounds, f"at most {limit:,} values (this range has {count:,})")
    return list(range(start, start + count * step, step))


def _values(where: str, name: str, raw: Any, rules: Mapping, limit: int) -> list:
    """The raw values of one column: a non-empty list, or a range expanded."""
    if is_range(raw):
        return range_values(where, raw, rules[name], limit)
    if not isinstance(raw, list) or not raw:
        ranges = " or a range ({pow2: [lo, hi]}, {range: [start, stop, step]})" \
            if isinstance(rules[name], Int) else ""
        raise fail(where, raw, f"a non-empty list of values{ranges}")
    return raw


def count_values(raw: Any, rules: Mapping, name: str, limit: int) -> int:
    """How many values a column has, without expanding it (0 when it is malformed)."""
    try:
        return len(_values("", name, raw, rules, limit))
    except SweepError:
        return 0


# -- axes ---------------------------------------------------------------------------------------

def read_axes(axes_raw: Mapping, public: Sequence[str], rules: Mapping, normalize: Normalize,
              problems: Problems, limit: int,
              overrides: Mapping[str, list] = {}) -> list[AxisGroup]:
    """Every axis of ``axes_raw`` checked and normalized (each mistake into ``problems``), with
    ``overrides`` (field -> normalized rows, from :func:`read_overrides`) applied."""
    groups: list[AxisGroup] = []
    owner: dict[str, str] = {}
    for key, raw in axes_raw.items():
        where = f"axes.{shown_key(key)}"
        with problems.check():
            if isinstance(raw, Mapping) and ZIP in raw and key not in public:
                group = _zip_group(where, raw, public, rules, normalize, problems, limit)
            else:
                if key not in public:
                    raise unknown_name(where, key, public, "field")
                if key in overrides:
                    group = AxisGroup(where, (key,), tuple(overrides[key]))
                else:
                    values = _values(where, key, raw, rules, limit)
                    rows = []
                    for i, value in enumerate(values):
                        with problems.check():
                            rows.append(normalize(f"{where}[{i}]", key, value))
                    group = AxisGroup(where, (key,), tuple(rows))
            if group is None:
                continue
            for name in group.fields:
                if name in owner:
                    raise SweepError(f"{where}: {name} is already an axis ({owner[name]}); a "
                                     "field may vary in one axis only")
                owner[name] = where
            groups.append(_select(group, overrides, problems))
    for name, rows in overrides.items():
        if name not in owner:
            groups.append(AxisGroup(f"-s {name}", (name,), tuple(rows)))
    return groups


def _zip_group(where: str, raw: Mapping, public: Sequence[str], rules: Mapping,
               normalize: Normalize, problems: Problems, limit: int):
    columns = raw[ZIP]
    if set(raw) != {ZIP} or not isinstance(columns, Mapping) or len(columns) < 2:
        raise fail(where, raw, "a zipped group {zip: {field: [values], field: [values], ...}} "
                               "of two or more fields")
    values: dict[str, list] = {}
    for name, column in columns.items():
        at = f"{where}.zip.{shown_key(name)}"
        with problems.check():
            if name not in public:
                raise unknown_name(at, name, public, "field")
            values[name] = _values(at, name, column, rules, limit)
    if len(values) != len(columns):
        return None
    lengths = {len(v) for v in values.values()}
    if len(lengths) > 1:
        raise SweepError(f"{where}.zip: got " + ", ".join(f"{n} with {len(v)} values"
                                                          for n, v in values.items())
                         + "; expected as many values in each zipped field")
    rows = []
    for i, point in enumerate(zip(*values.values())):
        row: dict = {}
        before = problems.count
        for name, value in zip(values, point):
            with problems.check():
                row.update(normalize(f"{where}.zip.{name}[{i}]", name, value))
        if problems.count == before:  # a point with a wrong value is left out, not half-made
            rows.append(row)
    return AxisGroup(where, tuple(values), tuple(rows))


def _select(group: AxisGroup, overrides: Mapping[str, list], problems: Problems) -> AxisGroup:
    """A zipped group keeps the points whose overridden fields hold one of the given values."""
    rows = list(group.rows)
    for name in group.fields:
        if name not in overrides or len(group.fields) == 1:
            continue
        wanted = overrides[name]
        missing = [w for w in wanted if not any(_agrees(r, w) for r in rows)]
        if missing:
            present = sorted({str(r.get(name)) for r in group.rows}, key=_natural)
            problems.add(SweepError(
                f"-s {name}: got {short_repr([m.get(name) for m in missing])}, expected values "
                f"zipped in {group.where}: {', '.join(present)}"))
        rows = [r for r in rows if any(_agrees(r, w) for w in wanted)]
    return AxisGroup(group.where, group.fields, tuple(rows))


def _agrees(row: Mapping, partial: Mapping) -> bool:
    return all(row.get(k) == v for k, v in partial.items())


def _natural(text: str):
    return (len(text), text)


def count_points(axes_raw: Mapping, public: Sequence[str], rules: Mapping, limit: int,
                 overrides: Mapping[str, list] = {}) -> tuple[int, str]:
    """The product's size, counted from the raw axes (nothing expanded), and how it reads
    (``backend (4) x tokens (6)``)."""
    sizes = []
    for key, raw in axes_raw.items():
        if key in overrides:
            n = len(overrides[key])
        elif isinstance(raw, Mapping) and ZIP in raw and isinstance(raw[ZIP], Mapping):
            counts = [count_values(c, rules, n, limit) for n, c in raw[ZIP].items()
                      if n in public]
            n = min(counts) if counts else 0
        elif key in public:
            n = count_values(raw, rules, key, limit)
        else:
            n = 0
        sizes.append((shown_key(key), n))
    sizes += [(f"-s {k}", len(v)) for k, v in overrides.items() if k not in axes_raw]
    total = 1
    for _, n in sizes:
        total *= max(n, 1)
    return total, " x ".join(f"{k} ({n})" for k, n in sizes)


# -- the product --------------------------------------------------------------------------------

def expand(groups: Sequence[AxisGroup], defaults: Mapping, excludes: Sequence[tuple[int, dict]],
           exclude_raw: Sequence, includes: Sequence[dict], make: Callable[[str, dict], Any],
           show: Callable[[Mapping, str], str], problems: Problems,
           defaults_for: Callable[[dict, dict], Mapping] = lambda d, own: d,
           doubtful: Callable[[Mapping], bool] = lambda exclude: False,
           causes: Any = None) -> list:
    """The product of the axis groups, less the excludes, plus the includes; each case once
    (``make(where, values)`` builds one, or returns None for a case not to check;
    ``show(values, field)`` names a value in messages, ``defaults_for(defaults, own)`` the
    defaults a case with its own values takes). A case's mistake goes to ``causes``
    (``add(where, exc)``, then ``report(problems)``: the loader's
    :class:`~attnbench.sweep.one_pass.SharedCauses` says a cause many cases share once), else
    straight to ``problems``. An exclude that removes nothing is a mistake (a typo would
    otherwise go unnoticed), unless ``doubtful(exclude)``: it may match only values left out
    for their own mistakes."""
    cases: dict[str, Any] = {}

    def add(where: str, values: dict) -> None:
        try:
            case = make(where, values)
        except SweepError as exc:
            if causes is None:
                problems.add(exc)
            else:
                causes.add(where, exc)
            return
        if case is not None:
            cases.setdefault(case.id, case)

    names = [n for g in groups for n in g.fields]
    used = set()
    for combo in itertools.product(*(g.rows for g in groups)):
        own: dict = {}
        for part in combo:
            own.update(part)
        values = {**defaults_for(dict(defaults), own), **own}
        hits = {i for i, ex in excludes if _agrees(values, ex)}
        if hits:
            used |= hits
            continue
        add("axes(" + ", ".join(f"{n}={show(values, n)}" for n in names) + ")", values)
    for i, inc in enumerate(includes):
        add(f"include[{i}]", {**defaults_for(dict(defaults), inc), **inc})
    if causes is not None:
        causes.report(problems)
    for i, ex in excludes:
        if i not in used and not doubtful(ex):
            problems.add(fail(f"exclude[{i}]", exclude_raw[i], "an entry that matches some "
                              "case of the axes' product (each field it names must be set by "
                              "defaults or an axis, to a value listed there)"))
    return list(cases.values())


# -- overrides ----------------------------------------------------------------------------------

def split_overrides(overrides: Sequence[str], public: Sequence[str], problems: Problems) -> tuple[dict[str, Any], list[tuple[list[str], Any]]]:
    """``-s PATH=VALUE`` texts -> (case field -> raw value, [(document path, raw value)])."""
    fields: dict[str, Any] = {}
    paths: list[tuple[list[str], Any]] = []
    for text in overrides:
        with problems.check():
            path, sep, value_text = text.partition("=")
            path = path.strip()
            if not sep or not path:
                raise SweepError(f"-s {short_repr(text)}: expected FIELD=VALUE, e.g. "
                                 "-s seqlen_q=1024 or -s dtype=[fp32,bf16]")
            if len(value_text) > MAX_OVERRIDE_CHARS:
                raise SweepError(f"-s {shown_key(path)}: a value of more than "
                                 f"{MAX_OVERRIDE_CHARS} characters")
            value = load_yaml(value_text, f"-s {shown_key(path)}")
            parts = path.split(".")
            if len(parts) == 1 and path in public:
                if path in fields:
                    raise SweepError(f"-s {path}: given twice")
                fields[path] = value
            elif parts[0] in ("defaults", "axes") and len(parts) == 2 and parts[1] in public:
                fields[parts[1]] = value
            elif (parts in (["name"], ["description"]) or (parts[0] == "options" and (
                    len(parts) == 2 or (len(parts) == 3 and parts[1] == "timing")))):
                paths.append((parts, value))  # checked with the file's own keys
            else:
                raise unknown_name(f"-s {shown_key(path)}", path,
                                   [*public, "name", "description", "options.KEY",
                                    "options.timing.KEY"], "field")
    return fields, paths


def set_paths(data: Mapping, paths: list[tuple[list[str], Any]]) -> dict:
    """The sweep document with ``-s options.timeout_s=60``-style values set (a copy)."""
    out = dict(data)
    for parts, value in paths:
        node = out
        for part in parts[:-1]:
            child = node.get(part)
            node[part] = dict(child) if isinstance(child, Mapping) else {}
            node = node[part]
        node[parts[-1]] = value
    return out


def read_overrides(fields: Mapping[str, Any], rules: Mapping, normalize: Normalize,
                   problems: Problems, limit: int) -> dict[str, list[dict]]:
    """Each overridden field's values, normalized: a list, a range, or one value."""
    out: dict[str, list[dict]] = {}
    for name, raw in fields.items():
        where = f"-s {name}"
        with problems.check():
            values = _values(where, name, raw, rules, limit) if (
                isinstance(raw, list) or is_range(raw)) else [raw]
            rows = []
            for i, value in enumerate(values):
                with problems.check():
                    rows.append(normalize(where if len(values) == 1 else f"{where}[{i}]",
                                          name, value))
            out[name] = rows
    return out


def cross_includes(includes: list[dict], overrides: Mapping[str, list[dict]]) -> list[dict]:
    """Each include once per combination of the overridden values."""
    if not overrides:
        return includes
    combos = [dict(itertools.chain.from_iterable(r.items() for r in combo))
              for combo in itertools.product(*overrides.values())]
    return [{**inc, **combo} for inc in includes for combo in combos]


def reachable(partial: Mapping, overrides: Mapping[str, list[dict]]) -> bool:
    """Whether an exclude can still match once the overrides hold: False when it names an
    overridden field with a value outside the given ones (it is then dropped, not an error)."""
    for rows in overrides.values():
        shared = [r for r in rows if set(r) & set(partial)]
        if shared and not any(all(partial.get(k, v) == v for k, v in r.items()) for r in shared):
            return False
    return True
