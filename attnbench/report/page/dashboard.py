"""Dashboard definitions: which panels, in which order, with which axes and filters.

A dashboard file (YAML)::

    title: attnbench report
    panels:
      - kind: throughput            # one of PANEL_KINDS
        title: Throughput
        x: seqlen_q                 # any column of attnbench.report.read.data.frame
        series: backend
        facets: [gpu_kind, dtype, features]
        filter: {world_size: 1}     # keep rows whose column is one of these values
        exclude: {verdict: [crash]} # drop rows whose column is one of these values
      - kind: accuracy_heatmap
    table:
      filters: [verdict, backend, features]

Every mistake raises :class:`~attnbench.report.read.data.ReportError` as
``FILE: panels[1].facets[0]: got 'colour', expected one of ...``; the CLI shows it and exits 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from attnbench.errors import ReportError
from attnbench.errors import short_repr, shown_key
from attnbench.report.read.data import CHECK_COLUMNS, DIRECTIONS, FILTER_COLUMNS
from attnbench.results.records import NOT_RUN_VERDICTS, TENSORS
from attnbench.validation import load_yaml, read_input_file

# kind -> {option: default}. The type of the default is the type an option must have
# (a list default: a list of strings; None: an optional string).
PANEL_OPTIONS: dict[str, dict[str, Any]] = {
    "verdict_matrix": {"rows": "features", "columns": "backend"},
    "accuracy_heatmap": {"tensors": list(TENSORS) + list(CHECK_COLUMNS), "sort": "verdict",
                         "max_rows": 120,
                         "decades": 2},
    "throughput": {"x": "seqlen_q", "series": "backend",
                   "facets": ["gpu_kind", "dtype", "features"], "directions": list(DIRECTIONS),
                   "band": True, "max_figures": 12},
    "error_vs_seqlen": {"x": "seqlen_q", "series": "backend", "facets": ["dtype"],
                        "tensors": list(TENSORS), "max_figures": 6},
    "error_trend": {"tensors": list(TENSORS), "max_figures": 4},
    "parallel": {"series": "backend", "directions": list(DIRECTIONS)},
    "architecture": {"x": "seqlen_q", "series": "backend", "baseline": None,
                     "directions": list(DIRECTIONS)},
    "decode": {"x": "seqlen_kv", "facets": ["gpu_kind", "dtype", "attention_kind", "seqlen_q"],
               "max_figures": 12},
    "fp8": {"facets": ["gpu_kind"], "max_figures": 6},
    "compile": {"facets": ["gpu_kind"], "max_rows": 24, "max_figures": 4},
}
PANEL_KINDS = tuple(PANEL_OPTIONS)
COMMON_OPTIONS = ("kind", "title", "description", "filter", "exclude")
DEFAULT_TITLES = {
    "throughput": "Throughput",
    "accuracy_heatmap": "Accuracy: error over bound, case x tensor",
    "verdict_matrix": "Verdicts: feature combination x backend",
    "error_vs_seqlen": "Error vs sequence length",
    "error_trend": "Error trend: growth with length against the fused baseline",
    "parallel": "Context / tensor parallel scaling",
    "architecture": "Architecture comparison",
    "decode": "Decode: bandwidth and latency vs cache length",
    "fp8": "fp8: kernel vs quantization error, and speed-up over bf16",
    "compile": "Triton compile time per kernel variant (apart from the timed figures)",
}
# Options whose values must be one of a fixed set (besides column names).
_CHOICES: dict[str, tuple[str, ...]] = {
    "directions": DIRECTIONS,
    "tensors": TENSORS + CHECK_COLUMNS,  # error_vs_seqlen draws only the tensors among them
    "sort": ("verdict", "features", "worst", "label"),
}
_COLUMN_OPTIONS = ("x", "series", "facets", "rows", "columns")
TABLE_OPTIONS = {"filters": ["verdict", "backend", "features"]}


@dataclass(frozen=True)
class Panel:
    kind: str
    title: str
    description: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    include: dict[str, list[Any]] = field(default_factory=dict)
    exclude: dict[str, list[Any]] = field(default_factory=dict)
    index: int = 0

    def __getitem__(self, name: str) -> Any:
        return self.options[name]

    @property
    def slug(self) -> str:
        return f"p{self.index:02d}-{self.kind.replace('_', '-')}"


@dataclass(frozen=True)
class Dashboard:
    title: str
    panels: tuple[Panel, ...]
    table_filters: tuple[str, ...]
    path: str = "<built-in>"
    description: str = ""


PACKED_THROUGHPUT: dict[str, Any] = {
    "kind": "throughput", "title": "Packed batches: throughput vs total tokens",
    "filter": {"packed": True, "world_size": 1}, "exclude": {"decode": [True]}, "x": "tokens",
    "facets": ["gpu_kind", "dtype", "head_dim", "features"], "max_figures": 6}
"""Packed (variable-length) cases against the tokens of the whole pack."""


def default_dashboard() -> Dashboard:
    """Every panel kind with its defaults (used when no dashboards/default.yaml is found)."""
    panels: list[dict[str, Any]] = [{"kind": k} for k in PANEL_KINDS]
    for p in panels:
        if p["kind"] == "accuracy_heatmap":
            p["exclude"] = {"verdict": list(NOT_RUN_VERDICTS)}
        if p["kind"] == "throughput":
            p["filter"] = {"world_size": 1}  # multi-rank cases have their own panel
            p["exclude"] = {"decode": [True]}  # memory-bound: GB/s in the decode panel
    at = next(i for i, p in enumerate(panels) if p["kind"] == "throughput") + 1
    panels.insert(at, PACKED_THROUGHPUT)
    return parse_dashboard({"title": "attnbench report", "panels": panels}, "<built-in>")


def load_dashboard(path: str | Path) -> Dashboard:
    text = read_input_file(path, "dashboard file", ReportError)
    return parse_dashboard(load_yaml(text, str(path), ReportError), str(path))


def _fail(filename: str, where: str, given: Any, expected: str) -> ReportError:
    return ReportError(f"{filename}: {where}: got {short_repr(given)}, expected {expected}")


def parse_dashboard(data: Any, filename: str) -> Dashboard:
    top = ("title", "description", "panels", "table")
    if not isinstance(data, Mapping):
        raise ReportError(f"{filename}: expected a mapping with keys {', '.join(top)}, "
                          f"got {type(data).__name__}")
    for key in data:
        if key not in top:
            raise ReportError(f"{filename}: {shown_key(key)}: unknown key, expected one of "
                              f"{', '.join(top)}")
    title = data.get("title", "attnbench report")
    if not isinstance(title, str):
        raise _fail(filename, "title", title, "a string")
    description = data.get("description") or ""
    if not isinstance(description, str):
        raise _fail(filename, "description", description, "a string")
    panels_raw = data.get("panels")
    if not isinstance(panels_raw, list) or not panels_raw:
        raise _fail(filename, "panels", panels_raw, "a non-empty list of panels "
                    f"(each a mapping with kind: one of {', '.join(PANEL_KINDS)})")
    panels = tuple(_parse_panel(filename, i, raw) for i, raw in enumerate(panels_raw))

    table_raw = data.get("table") or {}
    if not isinstance(table_raw, Mapping):
        raise _fail(filename, "table", table_raw, "a mapping (filters: [columns])")
    for key in table_raw:
        if key not in TABLE_OPTIONS:
            raise ReportError(f"{filename}: table.{shown_key(key)}: unknown option, expected one "
                              "of "
                              f"{', '.join(TABLE_OPTIONS)}")
    filters = table_raw.get("filters", TABLE_OPTIONS["filters"])
    _check_columns(filename, "table.filters", filters, as_list=True)
    return Dashboard(title=title, panels=panels, table_filters=tuple(filters), path=filename,
                     description=description)


def _parse_panel(filename: str, i: int, raw: Any) -> Panel:
    where = f"panels[{i}]"
    if not isinstance(raw, Mapping):
        raise _fail(filename, where, raw, "a mapping with kind: one of " + ", ".join(PANEL_KINDS))
    kind = raw.get("kind")
    if kind not in PANEL_OPTIONS:
        raise _fail(filename, f"{where}.kind", kind, "one of " + ", ".join(PANEL_KINDS))
    defaults = PANEL_OPTIONS[kind]
    options = {k: (list(v) if isinstance(v, list) else v) for k, v in defaults.items()}
    for key, value in raw.items():
        if key in COMMON_OPTIONS:
            continue
        if key not in defaults:
            allowed = list(COMMON_OPTIONS[1:]) + list(defaults)
            raise ReportError(f"{filename}: {where}.{shown_key(key)}: unknown option for kind "
                              f"{kind}, "
                              f"expected one of {', '.join(allowed)}")
        options[key] = _check_option(filename, f"{where}.{key}", key, defaults[key], value)
    title = raw.get("title", DEFAULT_TITLES[kind])
    if not isinstance(title, str):
        raise _fail(filename, f"{where}.title", title, "a string")
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise _fail(filename, f"{where}.description", description, "a string")
    include = _parse_filter(filename, f"{where}.filter", raw.get("filter"))
    exclude = _parse_filter(filename, f"{where}.exclude", raw.get("exclude"))
    return Panel(kind=kind, title=title, description=description, options=options,
                 include=include, exclude=exclude, index=i)


def _check_option(filename: str, where: str, key: str, default: Any, value: Any) -> Any:
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise _fail(filename, where, value, "true or false")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise _fail(filename, where, value, "a positive integer")
        return value
    if isinstance(default, list):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _fail(filename, where, value, "a list of names")
        if key in _CHOICES:
            for j, v in enumerate(value):
                if v not in _CHOICES[key]:
                    raise _fail(filename, f"{where}[{j}]", v, "one of " + ", ".join(_CHOICES[key]))
            if not value:
                raise _fail(filename, where, value, "a non-empty list")
        if key in _COLUMN_OPTIONS:
            _check_columns(filename, where, value, as_list=True)
        return list(value)
    if default is None or isinstance(default, str):
        if value is None and default is None:
            return None
        if not isinstance(value, str):
            raise _fail(filename, where, value, "a string")
        if key in _CHOICES and value not in _CHOICES[key]:
            raise _fail(filename, where, value, "one of " + ", ".join(_CHOICES[key]))
        if key in _COLUMN_OPTIONS:
            _check_columns(filename, where, value, as_list=False)
        return value
    raise AssertionError(key)  # every default type is handled above


def _check_columns(filename: str, where: str, value: Any, *, as_list: bool) -> None:
    values = value if as_list else [value]
    if as_list and not isinstance(value, list):
        raise _fail(filename, where, value, "a list of column names")
    for j, v in enumerate(values):
        if v not in FILTER_COLUMNS:
            raise _fail(filename, f"{where}[{j}]" if as_list else where, v,
                        "one of " + ", ".join(FILTER_COLUMNS))


def _parse_filter(filename: str, where: str, raw: Any) -> dict[str, list[Any]]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise _fail(filename, where, raw, "a mapping of column: value or [values]")
    out: dict[str, list[Any]] = {}
    for col, value in raw.items():
        if col not in FILTER_COLUMNS:
            raise _fail(filename, f"{where}.{col}", col,
                        "a column, one of " + ", ".join(FILTER_COLUMNS))
        values = value if isinstance(value, list) else [value]
        for j, v in enumerate(values):
            if not isinstance(v, (str, int, float, bool)):
                raise _fail(filename, f"{where}.{col}", v, "a scalar or a list of scalars")
        out[str(col)] = list(values)
    return out
