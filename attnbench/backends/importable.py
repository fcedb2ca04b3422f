"""Whether a sweep's ``module:object`` backends can be imported where their cases will run.

A backend module a rank process cannot import used to fail every case *after* it ran (each
case an ``error`` with ``ModuleNotFoundError``). :func:`unimportable` finds that out before the
first case, in one line per backend, and imports nothing: it asks the import system's finders
where each part of the dotted name would be loaded from, without running any module (a name in
a sweep is not yet known to be a backend -- ``os:getcwd`` is refused only once loaded, by
:func:`attnbench.backends.get_backend`). ``attnbench validate`` asks in the client,
``attnbench run`` on every Dask worker (whose environment its rank processes inherit).
``validate`` also reads the module's source for the object (:func:`importable_here`), still
running nothing.

Torch-free: it runs in the client and in Dask workers.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from typing import Iterable, Optional

from attnbench.backends.source_names import MAX_SOURCE_BYTES, top_level_names
from attnbench.validation import read_bounded, suggestion

FIX = ("put the folder that holds it on PYTHONPATH where the cases run (export PYTHONPATH=DIR "
       "before `attnbench run` or `attnbench worker`) or pip install it there; "
       "docs/backends.md#importable")


def third_party(backends: Iterable[str], registered: Iterable[str]) -> list[str]:
    """The ``module:object`` references among ``backends``, each once, in order (registered
    names and entry points are ours or installed: they need no look)."""
    known = set(registered)
    return list(dict.fromkeys(b for b in backends if ":" in b and b not in known))


def unimportable(refs: Iterable[str]) -> dict[str, str]:
    """ref -> why its module cannot be found from here, for each ref that cannot. The search
    path is a rank's: this process's ``sys.path`` (a rank puts its parent's first,
    :mod:`attnbench.execution.child`), then the current directory (a rank starts as ``python
    -c`` in its worker's directory: its own ``sys.path[0]``)."""
    missing = {}
    for ref in refs:
        module = ref.partition(":")[0]
        absent = _first_missing(module)
        if absent is not None:
            where = "" if absent == module else f" (its part {absent!r} is missing)"
            missing[ref] = f"module {module!r} is not importable{where} from {os.getcwd()}"
    return missing


def _first_missing(module: str) -> Optional[str]:
    """The first dotted prefix of ``module`` no finder locates, or None when all are found."""
    return _locate(module)[0]


def _locate(module: str):
    """(the first dotted prefix of ``module`` no finder locates, or None; ``module``'s spec
    when every part is found)."""
    search: Optional[list[str]] = None
    parts = module.split(".")
    spec = None
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        spec = _find(name, search)
        if spec is None:
            return name, None
        search = list(spec.submodule_search_locations or [])
        if depth < len(parts) and not search:  # a plain module has no submodules
            return ".".join(parts[:depth + 1]), None
    return None, spec


def importable_here(ref: str) -> Optional[str]:
    """None when the ``module:object`` ``ref`` can be loaded from here as far as a look without
    running anything can tell, else the user's line: its module is not found (as
    :func:`unimportable` says), or its module's source binds no such top-level name (read
    with :func:`~attnbench.backends.source_names.top_level_names`; with a did-you-mean).
    ``attnbench validate`` asks it of every ``module:object`` in a sweep."""
    module, _, attr = ref.partition(":")
    absent, spec = _locate(module)
    if absent is not None:
        return one_line(ref, unimportable([ref])[ref])
    first = attr.split(".")[0]
    names = _names_in(module, spec)
    if names is None or first in names or _is_submodule(module, first, spec):
        return None
    origin = str(getattr(spec, "origin", None) or "")
    source = f" ({origin})" if os.path.isabs(origin) else ""  # not 'frozen', 'built-in'
    return (f"backend {ref!r}: module {module!r}{source} binds no top-level name "
            f"{first!r}{suggestion(first, sorted(names))}; expected the name of the backend's "
            "class, instance or factory in it (docs/backends.md#importable)")


def _names_in(module: str, spec) -> Optional[frozenset[str]]:
    """The top-level names of ``module`` (its spec given), or None when they cannot be told
    without running it: a loaded module's own dict (nothing runs), else its ``.py`` source."""
    loaded = sys.modules.get(module)
    if loaded is not None:
        return None if "__getattr__" in vars(loaded) else frozenset(vars(loaded))
    origin = getattr(spec, "origin", None)
    if not origin or not str(origin).endswith(".py"):  # compiled, frozen, namespace: no source
        return None
    try:
        source = read_bounded(origin, MAX_SOURCE_BYTES)
    except (OSError, ValueError):
        return None
    return top_level_names(source)


def _is_submodule(module: str, name: str, spec) -> bool:
    """``pkg:sub`` names a submodule: importing the package may load it (cannot tell)."""
    search = list(getattr(spec, "submodule_search_locations", None) or [])
    return bool(search) and _find(f"{module}.{name}", search) is not None


def _find(name: str, search: Optional[list[str]]):
    """The spec the import system would use for ``name`` (module not executed): a loaded
    module's own, else the first finder's answer. A finder that raises counts as not found."""
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__spec__", None) is not None:
        return loaded.__spec__
    if search is None:  # a top-level name: the rank's path, then the other finders (editable
        # installs, zip imports) with theirs
        spec = importlib.machinery.PathFinder.find_spec(name, [*sys.path, os.getcwd()])
        if spec is not None:
            return spec
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        try:
            spec = find_spec(name, search)
        except Exception:  # noqa: BLE001 -- a broken third-party finder must not stop a run
            continue
        if spec is not None:
            return spec
    return None


def one_line(ref: str, reason: str, where: str = "") -> str:
    """The user's line for one backend that cannot be imported."""
    on = f" on {where}" if where else ""
    return f"backend {ref!r}: {reason}{on}: {FIX}"
