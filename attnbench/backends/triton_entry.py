"""How the ``triton`` backend is made: our kernels where Triton is installed, else a stand-in
whose every case is ``unsupported``.

Triton ships wheels for Linux only, so attnbench requires it on Linux only (an environment
marker in pyproject.toml): on a laptop (macOS, Windows) attnbench installs, reads results, and
records a ``triton`` case as ``unsupported`` with the reason, never as an ``error``.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from importlib import metadata
from typing import Optional

TRITON_ABSENT = ("triton is not installed here (Triton ships wheels for Linux only; on Linux: "
                 "pip install triton)")
MIN_TRITON = (3, 2)
"""The oldest Triton our kernels import under: jit's ``do_not_specialize_on_alignment`` (3.2);
pyproject.toml's floor. 3.1 (PyPI torch 2.5's pin) fails at import with a TypeError."""


def triton_importable() -> bool:
    # find_spec imports nothing; a None left in sys.modules (how tests hide a package) counts
    # as absent.
    if "triton" in sys.modules:
        return sys.modules["triton"] is not None
    return importlib.util.find_spec("triton") is not None


def triton_too_old(version: Optional[str] = None) -> Optional[str]:
    """Why the installed Triton is older than our kernels need, or None. Read from the
    distribution's metadata: nothing is imported."""
    if version is None:
        try:
            version = metadata.version("triton")
        except metadata.PackageNotFoundError:  # a source build or a renamed wheel: try it
            return None
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None or tuple(map(int, match.groups())) >= MIN_TRITON:
        return None
    floor = ".".join(map(str, MIN_TRITON))
    return (f"triton {version} is older than {floor}, which attnbench's kernels need "
            f"(pip install 'triton>={floor}'; on PyPI that pairs with torch 2.6 or newer)")


class TritonUnavailable:
    """The ``triton`` backend where Triton is absent or too old: supports nothing, says why."""

    name = "triton"
    keep_mask = None

    def __init__(self, reason: str = TRITON_ABSENT):
        self.reason = reason

    def supports(self, case, device):
        return self.reason

    def forward(self, q, k, v, spec):  # never called: supports() refuses every case
        raise RuntimeError(self.reason)

    def backward(self, ctx, dout):
        raise RuntimeError(self.reason)


def make_triton_backend():
    """The registry's factory for ``triton``."""
    if not triton_importable():
        return TritonUnavailable()
    too_old = triton_too_old()
    if too_old:
        return TritonUnavailable(too_old)
    from attnbench.backends.triton_backend import TritonBackend

    return TritonBackend()
