"""What a fresh GPU box already has, what is never carried to it, and the wheels it takes.

The box is the one issue #24 plans for, the lent H200 image (its package list as read on
2026-11-17): Python 3.12, its own torch 2.11 + CUDA 13 and triton 3.6, the scientific stack, and
no dask, distributed, tornado, partd, locket, tblib, zict, bokeh or xyzservices. A wheelhouse
carries attnbench's runtime closure minus both sets below, so it is small (the device tool
carries at most 64 MiB with the tree) and shadows nothing compiled on the box.
"""

from __future__ import annotations

import re

NEVER_CARRIED = frozenset({"torch", "triton", "pytorch-triton"})
"""The box's own builds (CUDA, its driver): a wheel of ours in front of them on ``PYTHONPATH``
would replace the box's GPU stack with another, so they are never in a wheelhouse."""
NEVER_CARRIED_PREFIXES = ("nvidia-", "cuda-")
"""CUDA's libraries as wheels (nvidia-cublas, nvidia-cudnn-cu13, cuda-bindings, ...)."""

BOX_HAS = frozenset({
    "numpy", "pandas", "matplotlib", "pillow", "contourpy", "cycler", "fonttools", "kiwisolver",
    "pyparsing", "python-dateutil", "six", "pyyaml", "packaging", "jinja2", "markupsafe",
    "click", "cloudpickle", "fsspec", "toolz", "msgpack", "psutil", "sortedcontainers",
    "urllib3", "narwhals", "zipp",
})
"""Names of attnbench's closure the box has (the image's list: KINDS.md, "Python packages
already there"). Not carried, so the box's builds of numpy & co. stay the ones imported; a
name missing here is merely carried. ``attnbench.offline verify`` checks their versions there."""

BOX_LACKS = frozenset({"dask", "distributed", "tornado", "partd", "locket", "tblib", "zict",
                       "bokeh", "xyzservices"})
"""What the issue found missing on the box: must never be taken for something it has."""

PYTHON_VERSION = "3.12"
"""The box's interpreter (3.12.3 there)."""

PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")
"""Wheel platforms the box takes (the device README's recipe, which ran there). pip matches a
tag exactly, not "this glibc or older", so each spelling is listed; a wheel published only for a
newer glibc needs its tag added (``--platform manylinux_2_34_x86_64``)."""


def canonical(name: str) -> str:
    """PEP 503's normal form: ``PyYAML`` and ``python_dateutil`` as the box's list spells them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def never_carried(name: str) -> bool:
    name = canonical(name)
    return name in NEVER_CARRIED or name.startswith(NEVER_CARRIED_PREFIXES)


def target_environment(python_version: str, machine: str = "x86_64") -> dict[str, str]:
    """Marker variables (PEP 508) of a Linux CPython ``python_version`` box, so ``dask``'s
    ``importlib_metadata; python_version < "3.12"`` is judged for the box, not for the Python
    that builds the wheelhouse (pip judges markers by the interpreter it runs in)."""
    full = python_version if python_version.count(".") == 2 else python_version + ".0"
    return {"python_version": ".".join(full.split(".")[:2]), "python_full_version": full,
            "implementation_name": "cpython", "implementation_version": full,
            "platform_python_implementation": "CPython", "sys_platform": "linux",
            "platform_system": "Linux", "os_name": "posix", "platform_machine": machine}
