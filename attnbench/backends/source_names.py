"""The names a Python module binds at its top level, read from its source, never run.

``attnbench validate`` says that ``mybackend:MyBakend`` names nothing in ``mybackend.py`` (did you
mean MyBackend?) without importing the module: importing would run the user's code, which a
check of a sweep file must not. A module can make names in ways no reading finds (``from x
import *``, a module ``__getattr__``, ``globals()[...] = ...``); when its source shows one of
them, :func:`top_level_names` answers None -- it cannot tell -- and nothing is reported: a
false "no such name" would refuse a backend that loads.
"""

from __future__ import annotations

import ast
from typing import Optional

MAX_SOURCE_BYTES = 4 << 20
"""A module's source larger than 4 MiB is not read (None: cannot tell). The largest module of
CPython's standard library is ~0.3 MB (``_pydecimal.py``); a backend module is a few kB."""

_DYNAMIC_CALLS = frozenset({"globals", "vars", "exec", "eval", "__import__"})
"""Calls anywhere in a module through which it may bind names no reading sees."""
_DYNAMIC_AT_TOP = frozenset({"setattr"})
"""Calls that bind names dynamically when made at module level (``setattr(self, ...)`` in a
method is common and harmless)."""
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp,
           ast.SetComp, ast.DictComp, ast.GeneratorExp)


def top_level_names(source: bytes | str) -> Optional[frozenset[str]]:
    """The names ``source`` binds at module level (definitions, assignments, imports, loop and
    ``with`` targets, also inside ``if`` / ``try`` blocks, and names a function declares
    ``global``), or None when it cannot tell (dynamic binding, a source that does not parse
    here, one over :data:`MAX_SOURCE_BYTES`)."""
    if len(source) > MAX_SOURCE_BYTES:
        return None
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # ValueError: a NUL byte
        return None
    names: set[str] = set()
    if not _bind(tree, names) or "__getattr__" in names:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            names.update(node.names)
        elif _dynamic(node, _DYNAMIC_CALLS) or _replaces_module(node):
            return None
    return frozenset(names)


def _bind(node: ast.AST, names: set[str]) -> bool:
    """Add the names ``node``'s module-level statements bind; False when one binds names
    dynamically at module level (a star import, ``setattr(...)``, ``x.__dict__``)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(child.name)
            continue
        if isinstance(child, _SCOPES):  # their own scope; ``:=`` inside binds out here
            names.update(n.target.id for n in ast.walk(child)
                         if isinstance(n, ast.NamedExpr) and isinstance(n.target, ast.Name))
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            for alias in child.names:
                if alias.name == "*":
                    return False
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
            names.add(child.id)
        elif isinstance(child, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and child.name:
            names.add(child.name)
        elif isinstance(child, ast.MatchMapping) and child.rest:
            names.add(child.rest)
        elif _dynamic(child, _DYNAMIC_AT_TOP) or (
                isinstance(child, ast.Attribute) and child.attr == "__dict__"):
            return False
        if not _bind(child, names):
            return False
    return True


def _dynamic(node: ast.AST, calls: frozenset[str]) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in calls)


def _replaces_module(node: ast.AST) -> bool:
    """``sys.modules[__name__] = obj``: the module becomes another object."""
    return (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Attribute) and node.value.attr == "modules")
