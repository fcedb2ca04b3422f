"""The installed third-party attention package as an adapter must know it: importable or not,
its version, and the keyword arguments its functions take.

Releases differ in what they take (flash-attn's ``softcap`` arrived in 2.6, FA3 renamed
``descale_q`` to ``q_descale``): an adapter that passes a name the installed release does not
know fails with a ``TypeError`` in the middle of a sweep, and one that drops a name it needs runs
another problem under the case's name. :func:`lacking` says which names are missing, with the
package's version, so ``supports()`` refuses the case with a reason a user can act on.

Torch-free; the package itself is imported only when asked (on the rank).
"""

from __future__ import annotations

import importlib
import inspect
import re
from importlib import metadata
from typing import Callable, Iterable, Mapping, Optional


def unavailable(module: str) -> Optional[str]:
    """Why ``module`` cannot be imported here, or None when it can."""
    try:
        importlib.import_module(module)
    except Exception as exc:  # ImportError, or a broken CUDA extension raising at import
        return f"{module} is not importable here ({type(exc).__name__}: {str(exc)[:100]})"
    return None


def version_of(module: str) -> str:
    """``<distribution> <version>`` of the installed package that provides ``module``
    (``flash_attn 2.5.9``, ``flash_attn_3 3.0.0b1``), from the package metadata or the module's
    ``__version__``; ``<module> (version unknown)`` when neither says."""
    top = module.partition(".")[0]
    try:
        for dist in metadata.packages_distributions().get(top, ()):
            return f"{dist} {metadata.version(dist)}"
    except Exception:  # broken metadata of an unrelated package: fall back to the module
        pass
    try:
        found = getattr(importlib.import_module(top), "__version__", None)
    except Exception:
        found = None
    return f"{top} {found}" if found else f"{top} (version unknown)"


def keywords(fn: Callable) -> Optional[frozenset[str]]:
    """The names ``fn`` takes by keyword; None when it takes any (``**kwargs``) or has no
    signature Python can read (a compiled function: then nothing is refused)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params
                     if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                   inspect.Parameter.KEYWORD_ONLY))


def lacking(module: str, fn: Callable, names: Iterable[str], *,
            since: Optional[Mapping[str, str]] = None, why: str = "") -> Optional[str]:
    """Why the installed ``module``'s ``fn`` cannot be called with ``names``: the names it does
    not take, with the package's version (``flash_attn 2.5.9: flash_attn_func takes no softcap
    (softcap since 2.6)``); None when it takes them all. ``since``: the release that brought
    each name, said for the missing ones; ``why``: what the names are for."""
    taken = keywords(fn)
    if taken is None:
        return None
    missing = [name for name in names if name not in taken]
    if not missing:
        return None
    notes = [f"{name} since {since[name]}" for name in missing if since and name in since]
    notes += [why] if why else []
    what = getattr(fn, "__name__", "the function")
    return (f"{version_of(module)}: {what} takes no {', '.join(missing)}"
            + (f" ({'; '.join(notes)})" if notes else ""))


def first_taken(fn: Callable, *spellings: tuple[str, ...]) -> Optional[tuple[str, ...]]:
    """The first of several spellings of one set of arguments that ``fn`` takes whole (FA3's
    ``(q_descale, k_descale, v_descale)`` or the older ``(descale_q, ...)``); None when it takes
    none of them. A function that takes anything takes the first."""
    taken = keywords(fn)
    for names in spellings:
        if taken is None or set(names) <= taken:
            return names
    return None


def release(module: str) -> Optional[tuple[int, ...]]:
    """The installed release of ``module``'s package as numbers (``2.11.0+abc`` -> (2, 11, 0));
    None when its version is unknown."""
    found = re.match(r"\d+(\.\d+)*", version_of(module).rpartition(" ")[2])
    return tuple(int(part) for part in found.group().split(".")) if found else None


def older_than(module: str, since: str) -> bool:
    """Whether ``module``'s package is a release before ``since`` ("1.10"); an unknown version
    counts as new enough (its call then says what it lacks)."""
    have = release(module)
    return have is not None and have < tuple(int(part) for part in since.split("."))
