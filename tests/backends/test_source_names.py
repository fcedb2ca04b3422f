"""A module's top-level names read from its source, never run: what ``validate`` checks a
``module:object`` against, and None (cannot tell) for every way a module binds names that a
reading cannot see -- a false "no such name" would refuse a backend that loads."""

from __future__ import annotations

import pytest

from attnbench.backends.source_names import MAX_SOURCE_BYTES, top_level_names

SOURCE = """
import os, numpy.linalg as la, a.b.c
from x import y as z, w
A = B, (C, *D) = 1, (2, 3)
E: int = 1
F += 1
def f(): global G; G = 1; local = 2
class K:
    inner = 1
async def af(): pass
if os.sep:
    H = 1
else:
    from q import I
try:
    import J
except ImportError as err:
    J = None
for L in ():
    pass
with open("x") as M:
    pass
print(N := 1)
[O := i for i in ()]
match 1:
    case {"k": P, **Q}:
        pass
    case [R, *S]:
        pass
"""


def test_every_kind_of_top_level_binding_is_found():
    names = top_level_names(SOURCE)
    assert names >= {"os", "la", "a", "z", "w", "A", "B", "C", "D", "E", "F", "f", "G", "K",
                     "af", "H", "I", "J", "err", "L", "M", "N", "O", "P", "Q", "R", "S"}
    assert not names & {"local", "inner", "i", "y", "x", "numpy"}


@pytest.mark.parametrize("source", [
    "from x import *\n",
    "def __getattr__(name): ...\n",
    "__getattr__, __dir__, __all__ = attach(__name__)\n",  # lazy_loader
    "globals()['X'] = 1\n",
    "def f():\n    vars()['X'] = 1\n",
    "exec('X = 1')\n",
    "import sys\nsetattr(sys.modules[__name__], 'X', 1)\n",
    "import sys\nsys.modules[__name__] = object()\n",
    "import sys\nsys.modules[__name__].__dict__.update(X=1)\n",
    "def broken(:\n",  # does not parse here (maybe a newer Python's syntax): cannot tell
    "X = 1\x00\n",
])
def test_what_a_reading_cannot_see_is_cannot_tell(source):
    assert top_level_names(source) is None


def test_a_method_setattr_is_harmless():
    assert top_level_names("class K:\n    def f(self):\n        setattr(self, 'a', 1)\n") == {"K"}


def test_a_source_too_large_is_not_parsed():
    # Margin: one byte over the bound; a bound removed would parse 4 MiB of assignments.
    assert top_level_names(b"#" * (MAX_SOURCE_BYTES + 1)) is None
    assert top_level_names(b"X = 1\n" + b"#" * (MAX_SOURCE_BYTES - 7)) == {"X"}
