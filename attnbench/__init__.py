"""attnbench: is a fused-attention kernel right, and how fast is it."""

from __future__ import annotations

import importlib
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
