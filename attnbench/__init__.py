"""attnbench: is a fused-attention kernel right, and how fast is it."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys
import warnings
from typing import Any, Callable

__version__ = "0.1.0"


def package_face(package: str, public: dict[str, tuple[str, ...]],
                 moved: dict[str, str] | None = None) -> tuple[list[str], Callable[[str], Any]]:
    """A package's face: ``__all__`` and a module ``__getattr__`` (PEP 562) for its public names,
    ``public`` mapping each module of the package to the names it gives other packages.

    A name is imported from its module when first asked for, so importing one torch-free module
    of a package never imports the package's torch modules (``from attnbench.problem import
    AttnSpec`` loads ``problem.attn_spec`` only). Inside attnbench, callers import from the
    defining module; tests/project/test_structure.py checks that what they import is public.

    ``moved``: names that left the package, each to the module that now defines it; they still
    import from here, with a :class:`DeprecationWarning` that names the new home."""
    where = {name: module for module, names in public.items() for name in names}
    moved = moved or {}

    def __getattr__(name: str) -> Any:
        if name in moved:
            warnings.warn(f"{package}.{name} moved to {moved[name]}.{name}; import it from there",
                          DeprecationWarning, stacklevel=2)
            return getattr(importlib.import_module(moved[name]), name)
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{where[name]}"), name)

    return sorted(where), __getattr__


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Old module names that still import, as the very module at the new name, with a
    :class:`DeprecationWarning` that says where it went (see :func:`moved_modules`)."""

    def __init__(self, package: str, moved: dict[str, str]) -> None:
        self.prefix = package + "."
        self.moved = {f"{package}.{old}": f"{package}.{new}" for old, new in moved.items()}
        self.specs: dict[str, Any] = {}  # new name -> its own spec, kept while an alias loads

    def new_name(self, name: str) -> str | None:
        """``name``'s new name: a moved module, or a submodule of a moved package."""
        if not name.startswith(self.prefix):
            return None
        for old, new in self.moved.items():
            if name == old or name.startswith(old + "."):
                return new + name[len(old):]
        return None

    def find_spec(self, name: str, path: Any = None, target: Any = None):
        new = self.new_name(name)
        if new is None:
            return None
        spec = importlib.util.find_spec(new)
        is_package = spec is not None and spec.submodule_search_locations is not None
        return importlib.util.spec_from_loader(name, self, is_package=is_package)

    def create_module(self, spec):
        new = self.new_name(spec.name)
        warnings.warn(f"{spec.name} moved to {new}; import it from there (the old name goes "
                      "in a later release)", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        self.specs[module.__name__] = module.__spec__  # the import system writes over it
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self.specs.pop(module.__name__)  # it keeps its own name and spec


def moved_modules(package: str, moved: dict[str, str]) -> None:
    """Keep the old names of ``package``'s moved modules importable: ``moved`` maps an old
    submodule name to its new one, both relative to ``package`` (``{"data": "read.data"}``).
    ``import package.data`` then gives the module ``package.read.data`` itself (one module
    object: a patch through either name is seen by both) and warns once per process. The
    finder goes first on ``sys.meta_path``: after it, the path finder would load a moved
    package's submodule (``package.panels.fp8``) a second time under the old name."""
    if not any(isinstance(f, _MovedModules) and f.prefix == package + "." for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedModules(package, moved))


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
