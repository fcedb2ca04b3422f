"""Mutating correct code by one visible edit, the way a person introduces a bug.

:func:`mutated` takes a function of a correct backend or parallel algorithm, replaces one exact
piece of its source text and compiles the result in a *copy* of the function's module
namespace, so the original stays untouched (nothing is monkeypatched; other cases in the same
rank process run the correct code). The edit is spelled out where the mutant is defined::

    backward_from_stats = mutated(NaiveBackend.backward_from_stats,
                                  "dq = torch.matmul(ds, k_rep)",
                                  "dq = torch.matmul(ds, k_rep) * 1.4426950408889634")

If the correct code changes so that the text to replace is gone (or appears twice), the mutant
fails to build with a message naming the function: a mutant must never silently turn into a
copy of the correct code.
"""

from __future__ import annotations

import functools
import inspect
import textwrap
import types
from typing import Any, Callable


class MutationError(RuntimeError):
    """The text a mutant edits is not (exactly once) in the correct code any more."""


def mutated(func: Callable, old: str, new: str, **rebind: Any) -> Callable:
    """A copy of ``func`` with the source text ``old`` replaced by ``new``; ``rebind`` adds or
    replaces names in the copy's globals (e.g. another mutated helper it should call)."""
    # ``old`` is matched as the file spells it -- or, for a copy made here, as its mutated text:
    # inspect.getsource follows __wrapped__ back to the original, which would drop the first
    # edit of a chain (mutant.gqa_dkv_mean lost its dK half that way).
    source = getattr(func, "__mutant_source__", None) or inspect.getsource(func)
    count = source.count(old)
    if count != 1:
        where = f"{func.__module__}.{func.__qualname__}"
        raise MutationError(f"mutant of {where}: expected the text {old!r} exactly once in its "
                            f"source, found it {count} times; update the mutant")
    source = textwrap.dedent(source.replace(old, new))
    # Decorators were applied to the original already; compile the bare function.
    lines = source.splitlines(keepends=True)
    while lines and lines[0].lstrip().startswith("@"):
        lines.pop(0)
    namespace = dict(func.__globals__)
    namespace.update(rebind)
    code = compile("".join(lines), f"<mutant of {func.__module__}.{func.__qualname__}>", "exec")
    exec(code, namespace)  # defines the function under its own name in ``namespace``
    copy = namespace[func.__name__]
    functools.update_wrapper(copy, func)
    copy.__wrapped__ = func  # type: ignore[attr-defined]
    copy.__mutant_source__ = source  # type: ignore[attr-defined]
    return copy


def rebound(func: Callable, **names: Any) -> Callable:
    """A copy of ``func`` whose global names ``names`` resolve to other objects (say, a mutated
    helper it calls), with the code unchanged."""
    namespace = dict(func.__globals__)
    namespace.update(names)
    copy = types.FunctionType(func.__code__, namespace, func.__name__, func.__defaults__,
                              func.__closure__)
    copy.__kwdefaults__ = func.__kwdefaults__
    functools.update_wrapper(copy, func)
    return copy
