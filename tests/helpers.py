"""Plain helpers the test modules share (no fixtures, no hooks: those live in conftest.py).

``ROOT`` is the repository root; ``attnbench_cmd()`` is the command line that runs the CLI
with the test's own Python. Test modules import them as ``from helpers import ...``; pytest
puts tests/ on sys.path (``pythonpath`` in pyproject.toml's [tool.pytest.ini_options]).
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def attnbench_cmd() -> list[str]:
    return [sys.executable, "-m", "attnbench.cli"]
