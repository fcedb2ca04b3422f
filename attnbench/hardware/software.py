"""Which software produced a number: versions, the project's commit, a backend's fingerprint.

Results travel between people and machines, so nothing here may fail: an unreadable version is
None. ``environment_differences`` names what changed between two environments (a resumed run
against its manifest, two runs in ``attnbench compare``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata as metadata
import inspect
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from attnbench.hardware.nvml import read_driver

GIT_TIMEOUT_S = 5.0  # `git status` on a large checkout over NFS; past this the state is unknown
FINGERPRINT_HEX = 12  # sha256 prefix: 48 bits, unique enough to tell two versions of one file
PACKAGE_DIR = Path(__file__).resolve().parent.parent  # attnbench/

# What environment_differences compares: a label and the keys that carry it. Current clocks are
# not compared (an idle card reports its idle clock); max and applications clocks are settings.
WATCHED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("driver", ("driver_version",)),
    ("CUDA", ("cuda_runtime", "cuda_driver_version")),
    ("cuDNN", ("cudnn",)),
    ("NCCL", ("nccl",)),
    ("torch", ("torch",)),
    ("triton", ("triton",)),
    ("kind", ("kind",)),
    ("clocks", ("sm_clock_max_mhz", "memory_clock_max_mhz", "sm_clock_app_mhz",
                "memory_clock_app_mhz")),
    ("power limit", ("power_limit_w", "power_limit_enforced_w")),
    ("commit", ("commit", "dirty")),
)


def software_environment(*, nvml: Any = None) -> dict[str, Any]:
    """Versions of everything between the kernel and the number, and the project's commit.
    Does not start CUDA (safe in a Dask worker before it spawns rank processes)."""
    torch = _import_torch()
    driver, cuda_driver = read_driver(nvml=nvml)
    return {
        "python": platform.python_version(),
        "torch": str(torch.__version__) if torch is not None else None,  # TorchVersion: a str
        "triton": distribution_version("triton") or distribution_version("pytorch-triton"),
        "cuda_runtime": getattr(getattr(torch, "version", None), "cuda", None),
        "cudnn": _cudnn_version(torch),
        "nccl": _nccl_version(torch),
        "driver_version": driver,
        "cuda_driver_version": cuda_driver,
        "attnbench": distribution_version("attnbench"),
        **git_state(),
    }


def git_state(directory: Path = PACKAGE_DIR) -> dict[str, Any]:
    """``{"commit": sha or None, "commit_date": ISO 8601 or None, "dirty": bool or None}`` of
    the checkout ``directory`` is tracked in; Nones for an installed copy (not a checkout), a
    missing git, or a timeout. ``dirty`` counts tracked files only: untracked scratch files do
    not change a result. ``commit_date`` is the committer date (``%cI``), by which
    ``attnbench history`` orders runs of several commits."""
    if not _tracked(directory):
        return {"commit": None, "commit_date": None, "dirty": None}
    commit = _git(directory, "rev-parse", "HEAD")
    date = _git(directory, "show", "-s", "--format=%cI", "HEAD") if commit else None
    status = _git(directory, "status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "commit_date": date or None,
            "dirty": None if status is None else bool(status)}


def backend_fingerprint(backend: Any) -> dict[str, Any]:
    """What code a backend object is: its module, the distribution and version that module was
    installed from (if any), and a sha256 of the module's source file (first 12 hex digits),
    which tells an edited checkout or a loose ``module:object`` file from the released one."""
    module_name = backend.__name__ if inspect.ismodule(backend) else getattr(
        backend, "__module__", None) or type(backend).__module__
    module = sys.modules.get(module_name)
    distribution = _distribution_of(module_name.split(".")[0])
    return {
        "module": module_name,
        "distribution": distribution,
        "version": distribution_version(distribution) if distribution else None,
        "source_sha256": _file_digest(getattr(module, "__file__", None)),
    }


def environment_differences(old: dict, new: dict) -> list[str]:
    """One line per watched item that differs: ``driver: 550.54.15 -> 560.35.03``. ``old`` and
    ``new`` may nest (``{"software": {...}, "device": {...}}``); a key absent from either side
    was not recorded there and is not compared; None against a value is a difference."""
    old_flat, new_flat = _flatten(old), _flatten(new)
    lines = []
    for label, keys in WATCHED:
        changed = [(k, old_flat[k], new_flat[k]) for k in keys
                   if k in old_flat and k in new_flat and old_flat[k] != new_flat[k]]
        if len(keys) == 1 and changed:
            lines.append(f"{label}: {changed[0][1]} -> {changed[0][2]}")
        elif changed:
            lines.append(f"{label}: " + "; ".join(f"{k} {a} -> {b}" for k, a, b in changed))
    return lines


def distribution_version(name: str) -> Optional[str]:
    """Installed version of a distribution, read from its metadata (nothing is imported)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _flatten(data: dict) -> dict[str, Any]:
    """Leaf keys of nested dicts, shallowest first (``kind`` at the top beats a nested one)."""
    flat: dict[str, Any] = {}
    level = [data]
    while level:
        deeper = []
        for mapping in level:
            for key, value in mapping.items():
                if isinstance(value, dict):
                    deeper.append(value)
                else:
                    flat.setdefault(key, value)
        level = deeper
    return flat


def _import_torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


def _cudnn_version(torch: Any) -> Optional[str]:
    try:
        version = torch.backends.cudnn.version()  # 90100 -> "9.1.0"
    except Exception:
        return None
    if not version:
        return None
    return f"{version // 10000}.{version % 10000 // 100}.{version % 100}" if version >= 10000 \
        else f"{version // 1000}.{version % 1000 // 100}.{version % 100}"  # cuDNN 8: 8907


def _nccl_version(torch: Any) -> Optional[str]:
    if torch is None or torch.version.cuda is None:
        return None
    try:
        version = torch.cuda.nccl.version()
    except Exception:
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _tracked(directory: Path) -> bool:
    """Is ``directory`` part of a git checkout that tracks it (not an ignored install)?"""
    return _git(directory, "ls-files", "--error-unmatch", "--", "__init__.py") is not None


def _git(directory: Path, *args: str) -> Optional[str]:
    # GIT_OPTIONAL_LOCKS=0: `git status` must not take index.lock from a person's own git use.
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}
    try:
        done = subprocess.run(["git", "-C", str(directory), *args], capture_output=True,
                              text=True, timeout=GIT_TIMEOUT_S, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@functools.lru_cache(maxsize=None)
def _distributions_by_package() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def _distribution_of(top_level: str) -> Optional[str]:
    names = _distributions_by_package().get(top_level)
    return names[0] if names else None


def _file_digest(path: Optional[str]) -> Optional[str]:
    if not path:
        return None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:FINGERPRINT_HEX]
    except OSError:
        return None
