"""attnbench: is a fused-attention kernel right, and how fast is it."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys
from typing import Any, Callable

__version__ = "0.1.0"


def package_face(package: str, public: dict[str, tuple[str, ...]]
                 ) -> tuple[list[str], Callable[[str], Any]]:
    """A package's face: ``__all__`` and a module ``__getattr__`` (PEP 562) for its public names,
    ``public`` mapping each module of the package to the names it gives other packages.

    A name is imported from its module when first asked for, so importing one torch-free module
    of a package never imports the package's torch modules (``from attnbench.problem import
    AttnSpec`` loads ``problem.attn_spec`` only). Inside attnbench, callers import from the
    defining module; tests/test_structure.py checks that what they import is public."""
    where = {name: module for module, names in public.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{where[name]}"), name)

    return sorted(where), __getattr__


class _CheckoutKernels(importlib.abc.MetaPathFinder):
    """``attnbench.kernels`` from a source checkout's top-level ``kernels/``.

    setup.py maps that folder into the package, so the wheel and an editable install have
    ``attnbench.kernels``; a bare checkout (a GPU box that runs the tree it was sent, a
    ``benchmarks/*.py`` script with the checkout on ``PYTHONPATH``) would not. This finder serves
    the same folder under the same name, and only that name."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def find_spec(self, name: str, path: Any = None, target: Any = None):
        if name != "attnbench.kernels":
            return None
        init = os.path.join(self.folder, "__init__.py")
        return importlib.util.spec_from_file_location(name, init,
                                                      submodule_search_locations=[self.folder])


def _serve_checkout_kernels() -> None:
    """Installed (``attnbench/kernels`` present) nothing is done; in a checkout (``kernels/`` and
    ``setup.py`` beside this package) the finder goes last on ``sys.meta_path``, after an editable
    install's own finder, which maps the same folder."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    folder = os.path.join(root, "kernels")
    if (os.path.exists(os.path.join(here, "kernels"))
            or not os.path.isfile(os.path.join(folder, "__init__.py"))
            or not os.path.isfile(os.path.join(root, "setup.py"))):
        return
    if not any(isinstance(f, _CheckoutKernels) for f in sys.meta_path):
        sys.meta_path.append(_CheckoutKernels(folder))


_serve_checkout_kernels()
