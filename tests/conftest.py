"""Fixtures shared by the tests, and the session's one setting (Triton's interpreter).

Plain helpers (ROOT, attnbench_cmd) are in helpers.py: test modules import them from there.
"""

import os
from pathlib import Path

import pytest

from helpers import ROOT, SUPPORT

# Triton's interpreter must be chosen before any kernel is defined; only without a GPU (a GPU
# test run must compile the kernels). kernels/__init__.py makes the same choice.
try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:
    pass


@pytest.fixture
def cli_env():
    """Environment for `attnbench` subprocesses: test backends importable, quiet warnings."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SUPPORT), str(ROOT), env.get("PYTHONPATH", "")])
    env["PYTHONWARNINGS"] = "ignore"
    return env


# -- runs shared by the report, compare and browser tests (made once per session) -------------


@pytest.fixture(scope="session")
def base(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp() / "report-runs"


@pytest.fixture(scope="session")
def tiny(base) -> Path:
    import report_runs

    return report_runs.tiny_run(base)


@pytest.fixture(scope="session")
def synthetic(base) -> dict:
    import report_runs

    return report_runs.synthetic_runs(base)
