"""Plain helpers the test modules share (no fixtures, no hooks: those live in conftest.py).

``ROOT`` is the repository root; ``attnbench_cmd()`` is the command line that runs the CLI
with the test's own Python; ``alive(pid)`` says whether a process still runs. Test modules import them as ``from helpers import ...``; pytest
puts tests/ on sys.path (``pythonpath`` in pyproject.toml's [tool.pytest.ini_options]).
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def attnbench_cmd() -> list[str]:
    return [sys.executable, "-m", "attnbench.cli"]


def alive(pid: int) -> bool:
    """Running (zombies count as dead: they are only waiting for a reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")
