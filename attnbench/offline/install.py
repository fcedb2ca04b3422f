"""On the box: a wheelhouse into a prefix, with no index and without touching torch or triton.

``pip install --no-index --no-deps --target PREFIX .whl/*.whl``: ``--no-index`` so nothing is
looked for anywhere but the named files (pip's configured ``find-links`` and extra indexes are
cleared too), ``--no-deps`` so pip never resolves, hence never replaces, the box's torch or
triton, ``--target`` so nothing of the box's own environment is written. ``PYTHONPATH=PREFIX``
then puts the prefix in front of the box's site-packages, which is why a wheelhouse carries
nothing the box has built for itself.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from attnbench.errors import UserError
from attnbench.offline.box import canonical, never_carried
from attnbench.offline.wheelhouse import MANIFEST

PIP_ISOLATED_ENV = {"PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull}
"""pip reads no configuration file (an index, find-links) and looks at no index."""
PIP_CLEARED = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_REQUIREMENT",
               "PIP_CONSTRAINT")


def pip_command(wheels: list[Path], prefix: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile",
            "--upgrade", "--quiet", "--target", str(prefix), *map(str, wheels)]


def wheels_of(wheelhouse: Path) -> list[Path]:
    """The wheelhouse's wheels: at least attnbench's, one per distribution, none of the box's
    own builds (each refusal is one line naming the file)."""
    wheels = sorted(wheelhouse.glob("*.whl")) if wheelhouse.is_dir() else []
    if not any(w.name.startswith("attnbench-") for w in wheels):
        raise UserError(f"{wheelhouse}: no attnbench wheel, expected a wheelhouse "
                        "(`make wheelhouse PYTHON_VERSION=3.12` on a machine with an index)")
    seen: dict[str, str] = {}
    for wheel in wheels:
        name = canonical(wheel.name.split("-")[0])
        if never_carried(name):
            raise UserError(f"{wheel}: the box's own {name} is never installed from a "
                            "wheelhouse: delete it and rebuild with `make wheelhouse`")
        if name in seen:
            raise UserError(f"{wheel}: a second {name} wheel beside {seen[name]}, expected one "
                            "version of each: rebuild with `make wheelhouse`")
        seen[name] = wheel.name
    return wheels


def check_target(wheelhouse: Path, version: tuple[int, int] = sys.version_info[:2]) -> None:
    """The wheelhouse was built for this Python (its manifest's first line names it): compiled
    wheels and markers (``importlib_metadata`` below 3.12) differ from one to the next."""
    manifest = wheelhouse / MANIFEST
    first = manifest.read_text().split("\n", 1)[0] if manifest.is_file() else ""
    match = re.search(r"CPython (\d+)\.(\d+)", first)
    if match and (int(match[1]), int(match[2])) != tuple(version):
        raise UserError(f"{manifest}: built for CPython {match[1]}.{match[2]}, this is "
                        f"{version[0]}.{version[1]}: rebuild with `make wheelhouse "
                        f"PYTHON_VERSION={version[0]}.{version[1]}`")


def install_wheelhouse(wheelhouse: Path, prefix: Path) -> list[Path]:
    """Install every wheel of ``wheelhouse`` into ``prefix`` (replacing older copies there)."""
    wheels = wheels_of(wheelhouse)
    check_target(wheelhouse)
    env = {k: v for k, v in os.environ.items() if k not in PIP_CLEARED} | PIP_ISOLATED_ENV
    proc = subprocess.run(pip_command(wheels, prefix), env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        last = [line for line in proc.stderr.splitlines() if line.strip()][-1:] or ["no output"]
        raise UserError(f"{prefix}: pip install --no-index failed (exit {proc.returncode}): "
                        f"{last[0]}")
    return wheels
