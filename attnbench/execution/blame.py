"""Whose exception is it: the backend's (its ``error``) or ours (a harness error)?

A backend is judged as fairly as our own code is blamed: an exception is the backend's when the
innermost frame of its traceback that is either ours or the backend's is the backend's -- a
module that defines the backend's class or one of its bases (a user's backend built on
``naive`` owns naive's frames too), or the backend's own CP/TP split
(``parallel_algorithm``). Frames of third-party libraries (torch, triton, a library the backend
wraps) are passed over: an exception raised inside ``torch.matmul`` belongs to whoever called
it. Anything else -- an exception from :mod:`attnbench`'s harness modules, or one with no frame
of either -- is ours.

Torch-free: it reads tracebacks and module files only.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable, Optional

from attnbench.errors import BackendError, exception_summary

_PACKAGE = Path(__file__).resolve().parent.parent
"""attnbench/: frames under it are the harness's, unless they are the backend's."""
_ROOT = _PACKAGE.parent


def backend_files(backend: Any, extra: Iterable[Optional[ModuleType]] = ()) -> set[Path]:
    """Source files of ``backend``: the modules of its class and of every base class, and the
    ``extra`` modules (its own CP/TP split)."""
    modules = [sys.modules.get(cls.__module__) for cls in type(backend).__mro__
               if cls.__module__ != "builtins"]
    files = set()
    for module in (*modules, *extra):
        file = getattr(module, "__file__", None)
        if file:
            files.add(Path(file).resolve())
    return files


def backend_frame(exc: BaseException, files: set[Path]) -> Optional[traceback.FrameSummary]:
    """The backend's frame that raised ``exc``, or None when the exception is ours: the
    innermost frame in ``files`` or in attnbench decides."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = Path(frame.filename).resolve()
        if path in files:
            return frame
        if path.is_relative_to(_PACKAGE):
            return None
    return None


def where(frame: traceback.FrameSummary) -> str:
    """``file:line in function``; attnbench's and the checkout's files relative to it."""
    path = Path(frame.filename).resolve()
    shown = path.relative_to(_ROOT) if path.is_relative_to(_ROOT) else path.name
    return f"{shown}:{frame.lineno} in {frame.name}"


def blame(exc: BaseException, backend: Any,
          extra: Iterable[Optional[ModuleType]] = ()) -> tuple[bool, str]:
    """(is the backend's, the record's reason): ``Type: message (raised in the backend at
    file:line in function)``, or ``harness error: Type: message (at file:line in function)``.
    A :class:`~attnbench.errors.BackendError` raised by the harness on the backend's behalf (a
    breach of the backend contract, :mod:`attnbench.accuracy.contract`) is the backend's, its
    message the reason."""
    if isinstance(exc, BackendError):
        return True, str(exc)
    frame = backend_frame(exc, backend_files(backend, extra)) if backend is not None else None
    summary = exception_summary(exc)
    if frame is not None:
        return True, f"{summary} (raised in the backend at {where(frame)})"
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if Path(f.filename).resolve().is_relative_to(_PACKAGE)]
    at = f" (at {where(ours[-1])})" if ours else ""
    return False, f"harness error: {summary}{at}"
