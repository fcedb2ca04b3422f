"""A JSON Schema of the sweep format, generated from the field table, for editors.

``attnbench schema`` prints it; ``sweeps/sweep.schema.json`` is a copy that the shipped sweeps
name in their first line (``# yaml-language-server: $schema=sweep.schema.json``), so VS Code's
YAML extension, Neovim's yamlls and JetBrains IDEs complete field names, offer the choices of a
field and flag a misspelt key while you type.

Nothing here names a case field except where a sweep spells a field differently from how it is
stored (``mask``, ``dtype`` aliases): every rule of :data:`attnbench.sweep.case.CASE_RULES` and of
the option dataclasses becomes a schema by its kind (:func:`rule_schema`), and each field's
docstring becomes its description. attnbench's own validation stays the judge (it also checks
relations between fields); the schema is what an editor can know.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Sequence

from attnbench.dtypes import ALIASES
from attnbench.sweep import length_mix
from attnbench.sweep.axes import ZIP
from attnbench.sweep.case import CASE_RULES, MAX_SIZE, PUBLIC_FIELDS, Case
from attnbench.sweep.load import _NAME
from attnbench.sweep.options import RunOptions, TimingOptions
from attnbench.validation import Choice, Flag, Int, Lengths, Name, PowerOfTwo, Real

SCHEMA_ID = "https://attnbench.invalid/sweep.schema.json"
"""A name, not an address: the schema travels in the repository and is never fetched."""


def rule_schema(rule: Any) -> dict[str, Any]:
    """The JSON Schema of one validation rule (``{}`` — anything — for a kind it does not know;
    ``tests/sweep/test_sweep_ergonomics.py`` fails then, so a new kind of rule gets a schema)."""
    if isinstance(rule, Int):
        return {"type": "integer", "minimum": rule.lo, "maximum": rule.hi}
    if isinstance(rule, Real):
        bounds: dict[str, Any] = {"type": "number"}
        if rule.lo > -float("inf"):
            bounds["exclusiveMinimum" if rule.lo_open else "minimum"] = rule.lo
        if rule.hi < float("inf"):
            bounds["exclusiveMaximum" if rule.hi_open else "maximum"] = rule.hi
        return bounds
    if isinstance(rule, Choice):
        return {"enum": list(rule.choices)}
    if isinstance(rule, Flag):
        return {"type": "boolean"}
    if isinstance(rule, Name):
        return {"type": "string", "minLength": 1, "maxLength": rule.limit,
                "pattern": f"^(?:{rule.pattern})$"}
    if isinstance(rule, PowerOfTwo):
        return {"enum": [0] + [1 << i for i in range(rule.hi.bit_length())]}
    if isinstance(rule, Lengths):  # the total is checked by attnbench, not the editor
        return {"type": "array", "minItems": 1, "maxItems": rule.max_count,
                "items": {"type": "integer", "minimum": 0, "maximum": rule.max_each}}
    return {}


def _mask_schema() -> dict[str, Any]:
    window = {"anyOf": [
        {"type": "integer", "minimum": 1, "maximum": MAX_SIZE,
         "description": "a causal sliding window of W keys"},
        {"type": "array", "minItems": 2, "maxItems": 2,
         "items": {"type": "integer", "minimum": -1, "maximum": MAX_SIZE},
         "description": "[left, right] keys around the aligned diagonal, -1 = unbounded"}]}
    return {"anyOf": [{"enum": ["none", "causal"]},
                      {"type": "object", "required": ["window"], "additionalProperties": False,
                       "properties": {"window": window}}]}


def _backend_schema(names: Sequence[str]) -> dict[str, Any]:
    reference = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*$"  # backends' own check
    return {"anyOf": [{"enum": list(names)},
                      {"type": "string", "pattern": reference,
                       "description": "a third-party backend as module:object"}]}


def _varlen_schema() -> dict[str, Any]:
    """A length generator (:mod:`attnbench.sweep.length_mix`), one alternative per distribution."""
    def one(kind: str, params: tuple[str, ...]) -> dict[str, Any]:
        props = {p: {"type": "integer", "minimum": 0} for p in params if p != "lengths"}
        if "sigma" in props:
            props["sigma"] = {"type": "number", "exclusiveMinimum": 0}
        return {"type": "object", "additionalProperties": False,
                "required": ["lengths", "total"], "properties": {"lengths": {"const": kind},
                                                                 **props}}
    return {"anyOf": [one(kind, params) for kind, params in length_mix.PARAMETERS.items()],
            "description": "document lengths drawn reproducibly, e.g. {lengths: lognormal, "
                           "mean: 2048, max: 16384, total: 65536, seed: 0}"}


def value_schema(name: str, backends: Sequence[str] = ()) -> dict[str, Any]:
    """How a sweep spells one value of field ``name``."""
    if name == "varlen":
        return _varlen_schema()
    if name == "mask":
        return _mask_schema()
    if name == "backend":
        return _backend_schema(backends)
    out = rule_schema(CASE_RULES[name])
    if name == "dtype":
        out = {"enum": [*out["enum"], *ALIASES]}
    return out


def _range_schema() -> dict[str, Any]:
    pair = {"type": "array", "items": {"type": "integer"}}
    return {"type": "object", "minProperties": 1, "maxProperties": 1, "additionalProperties": False,
            "properties": {
                "pow2": {**pair, "minItems": 2, "maxItems": 2,
                         "description": "powers of two from the first to the last, both included"},
                "range": {**pair, "minItems": 2, "maxItems": 3,
                          "description": "[start, stop] or [start, stop, step], stop included"}}}


def axis_schema(name: str) -> dict[str, Any]:
    """An axis on field ``name``: a non-empty list of values, or (integer fields) a range."""
    values = {"type": "array", "minItems": 1, "items": {"$ref": f"#/definitions/value.{name}"}}
    if isinstance(CASE_RULES.get(name), Int):
        return {"anyOf": [values, {"$ref": "#/definitions/range"}]}
    return values


def sweep_schema(backends: Sequence[str]) -> dict[str, Any]:
    """The schema; ``backends`` are the names a sweep may use besides ``module:object`` (the CLI
    passes the registry's public names: this package knows no registry)."""
    public = PUBLIC_FIELDS
    docs = {**_docstrings(Case), **_docstrings(RunOptions)}
    timing_docs = _docstrings(TimingOptions)

    def described(schema: dict, doc: str) -> dict:
        return {**schema, "description": doc} if doc else schema

    partial = {"type": "object", "minProperties": 1, "additionalProperties": False,
               "properties": {n: {"$ref": f"#/definitions/value.{n}"} for n in public}}
    zipped = {"type": "object", "required": [ZIP], "additionalProperties": False,
              "description": "a zipped group: its fields vary together, point by point",
              "properties": {ZIP: {"type": "object", "minProperties": 2,
                                   "additionalProperties": False,
                                   "properties": {n: {"$ref": f"#/definitions/axis.{n}"}
                                                  for n in public}}}}
    timing = {"type": "object", "additionalProperties": False, "properties": {
        f.name: described(rule_schema(f.metadata["rule"]), timing_docs.get(f.name, ""))
        for f in fields(TimingOptions)}}
    options = {"type": "object", "additionalProperties": False, "properties": {
        f.name: (described(timing, docs.get(f.name, "")) if f.name == "timing" else
                 described(rule_schema(f.metadata["rule"]), docs.get(f.name, "")))
        for f in fields(RunOptions)}}
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$id": SCHEMA_ID,
        "title": "attnbench sweep",
        "description": "Axes crossed into cases; `attnbench validate FILE` checks what a schema "
                       "cannot (relations between fields, backends, counts).",
        "type": "object",
        "required": ["name"],
        "additionalProperties": False,
        "properties": {
            "name": described(rule_schema(_NAME), "names the run directory"),
            "description": {"type": "string"},
            "defaults": {**partial, "minProperties": 0,
                         "description": "values of fields no axis sets"},
            "axes": {"type": "object", "description": "lists crossed into cases (cartesian "
                     "product); another key is a zipped group",
                     "properties": {n: {"$ref": f"#/definitions/axis.{n}"} for n in public},
                     "additionalProperties": zipped},
            "exclude": {"type": "array", "items": partial,
                        "description": "partial cases removed from the product"},
            "include": {"type": "array", "items": partial,
                        "description": "extra single cases (defaults apply)"},
            "options": described(options, "harness settings, not part of case ids"),
        },
        "definitions": {
            **{f"value.{n}": described(value_schema(n, backends), docs.get(n, ""))
               for n in public},
            **{f"axis.{n}": described(axis_schema(n), docs.get(n, "")) for n in public},
            "range": _range_schema(),
        },
    }


def _docstrings(cls: type) -> dict[str, str]:
    """Attribute docstrings (the string under a dataclass field), by field name."""
    try:
        tree = ast.parse(inspect.getsource(cls))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body
    out = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            out[node.target.id] = " ".join(after.value.value.split())
    return out


def schema_text(backends: Sequence[str]) -> str:
    return json.dumps(sweep_schema(backends), indent=1, sort_keys=False) + "\n"


def cmd_schema(args: argparse.Namespace, backends: Sequence[str]) -> int:
    text = schema_text(backends)
    if args.out:
        Path(args.out).write_text(text)
        print(f"attnbench: wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def add_schema_command(sub, backend_names: Callable[[], Sequence[str]]) -> None:
    cmd = sub.add_parser("schema", help="print the JSON Schema of sweep files (for editors)")
    cmd.add_argument("--out", metavar="FILE", help="write it to FILE instead of standard output")
    cmd.set_defaults(func=lambda args: cmd_schema(args, backend_names()))
