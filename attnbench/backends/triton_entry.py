"""How the ``triton`` backend is made: our kernels where Triton is installed, else a stand-in
whose every case is ``unsupported``.

Triton ships wheels for Linux only, so attnbench requires it on Linux only (an environment
marker in pyproject.toml): on a laptop (macOS, Windows) attnbench installs, reads results, and
records a ``triton`` case as ``unsupported`` with the reason, never as an ``error``.
"""

from __future__ import annotations

import importlib.util
import sys

TRITON_ABSENT = ("triton is not installed here (Triton ships wheels for Linux only; on Linux: "
                 "pip install triton)")


def triton_importable() -> bool:
    # find_spec imports nothing; a None left in sys.modules (how tests hide a package) counts
    # as absent.
    if "triton" in sys.modules:
        return sys.modules["triton"] is not None
    return importlib.util.find_spec("triton") is not None


class TritonUnavailable:
    """The ``triton`` backend where Triton is absent: supports nothing, says why."""

    name = "triton"
    keep_mask = None

    def supports(self, case, device):
        return TRITON_ABSENT

    def forward(self, q, k, v, spec):  # never called: supports() refuses every case
        raise RuntimeError(TRITON_ABSENT)

    def backward(self, ctx, dout):
        raise RuntimeError(TRITON_ABSENT)


def make_triton_backend():
    """The registry's factory for ``triton``."""
    if not triton_importable():
        return TritonUnavailable()
    from attnbench.backends.triton_backend import TritonBackend

    return TritonBackend()
