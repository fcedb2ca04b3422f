"""``make wheelhouse``: attnbench's wheel and what a fresh GPU box lacks, for the box's Python.

Three pip calls on a machine with an index: ``pip wheel --no-deps`` of the source tree (the
kernels ride in the wheel as ``attnbench.kernels``), ``pip install --dry-run --report`` of the
wheel's requirements for the box's wheel tags (one consistent set of versions), and ``pip
download --no-deps`` of exactly the pins :func:`~attnbench.offline.closure.carried` keeps. The
folder then holds one wheel per distribution and ``wheelhouse.txt`` (the pins and why each is
there); nothing else is ever fetched on the box.
"""

from __future__ import annotations

import email.parser
import importlib.metadata
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Sequence

from attnbench.errors import UserError
from attnbench.offline.box import BOX_HAS, canonical, never_carried, target_environment
from attnbench.offline.closure import (Pin, applies, bare, carried, requirement,
                                       resolved_from_report)

MANIFEST = "wheelhouse.txt"
PIP_WITH_REPORT = (22, 2)
"""``pip install --report`` appeared in pip 22.2."""
CARRY_LIMIT_MIB = 48
"""The device tool carries 64 MiB with the working tree (~3 MiB today): warn well before."""


def _pip(args: Sequence[str], what: str) -> None:
    """Run pip (its own output goes to the terminal); a failure is one line naming the step."""
    proc = subprocess.run([sys.executable, "-m", "pip", *args], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        last = [line for line in proc.stderr.splitlines() if line.strip()][-1:] or ["no output"]
        raise UserError(f"wheelhouse: {what} failed (pip exit {proc.returncode}): {last[0]}")


def _target_flags(python_version: str, platforms: Sequence[str]) -> list[str]:
    flags = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
    for platform in platforms:
        flags += ["--platform", platform]
    return flags


def wheel_requirements(wheel: Path) -> list[str]:
    """The ``Requires-Dist`` lines of a wheel's METADATA (extras' lines carry their marker)."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(archive.read(name).decode("utf-8"))
    return meta.get_all("Requires-Dist") or []


SOURCE_FILES = ("pyproject.toml", "setup.py", "README.md")
SOURCE_FOLDERS = ("attnbench", "kernels")


def _copy_tree(source: Path, scratch: str) -> Path:
    """What the wheel is built from, copied: setuptools' ``build/`` in the checkout would keep
    modules deleted since the last build and put them in the wheel."""
    missing = [n for n in (*SOURCE_FILES, *SOURCE_FOLDERS) if not (source / n).exists()]
    if missing:
        raise UserError(f"{source}: no {missing[0]}, expected attnbench's source tree (--source)")
    copy = Path(scratch) / "src"
    copy.mkdir()
    for name in SOURCE_FILES:
        shutil.copy(source / name, copy / name)
    for name in SOURCE_FOLDERS:
        shutil.copytree(source / name, copy / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return copy


def _check_pip() -> None:
    version = importlib.metadata.version("pip")
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if parts < PIP_WITH_REPORT:
        raise UserError(f"wheelhouse: pip {version} is too old, expected >= 22.2 "
                        f"(`{sys.executable} -m pip install -U pip`)")


def _claim(out: Path) -> None:
    """``out`` is new, empty, or a wheelhouse (wheels and the manifest): nothing else is
    deleted when it is rebuilt."""
    if not out.exists():
        return
    if not out.is_dir():
        raise UserError(f"{out}: not a folder, expected a wheelhouse folder (.whl)")
    other = [p.name for p in out.iterdir() if p.suffix != ".whl" and p.name != MANIFEST]
    if other:
        raise UserError(f"{out}: holds {other[0]!r}, expected only wheels and {MANIFEST}: "
                        "choose another --out")


def build(out: Path, source: Path, python_version: str, platforms: Sequence[str],
          without: Sequence[str] = ()) -> list[Path]:
    """Write the wheelhouse for a box with ``python_version`` into ``out`` (replacing an older
    one); return its wheels. ``without``: names left out, with what only they need."""
    _check_pip()
    _claim(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}-") as scratch:
        new = Path(scratch) / "wheels"
        print(f"wheelhouse: attnbench's wheel from {source}", flush=True)
        _pip(["wheel", "--no-deps", "-q", "-w", str(new), str(_copy_tree(source, scratch))],
             "pip wheel of attnbench")
        own = next(new.glob("attnbench-*.whl"))
        requires = wheel_requirements(own)
        environment = target_environment(python_version)
        skip = {canonical(n) for n in (*BOX_HAS, *without)}
        roots = [bare(r) for r in (requirement(line, own.name) for line in requires)
                 if applies(r, environment, ()) and not never_carried(r.name)
                 and canonical(r.name) not in skip]
        report = Path(scratch) / "report.json"
        print(f"wheelhouse: resolving for CPython {python_version} ({', '.join(platforms)})",
              flush=True)
        _pip(["install", "--dry-run", "--ignore-installed", "-q", "--report", str(report),
              "--target", str(Path(scratch) / "unused"), *_target_flags(python_version, platforms),
              *roots], "resolving the box's closure")
        pins = carried(resolved_from_report(json.loads(report.read_text())), requires,
                       environment, BOX_HAS, without)
        print(f"wheelhouse: downloading {len(pins)}: {' '.join(map(str, pins))}", flush=True)
        _pip(["download", "--no-deps", "-q", "-d", str(new),
              *_target_flags(python_version, platforms), *map(str, pins)], "pip download")
        wheels = _checked(new, pins)
        (new / MANIFEST).write_text(manifest_text(own, pins, python_version, platforms, without))
        if out.exists():
            shutil.rmtree(out)
        new.rename(out)
    return sorted(out.glob("*.whl"))


def _checked(folder: Path, pins: Sequence[Pin]) -> list[Path]:
    """One wheel per pin plus attnbench's, and none of the box's own builds."""
    wheels = sorted(folder.glob("*.whl"))
    names = [canonical(w.name.split("-")[0]) for w in wheels]
    expected = sorted([canonical(p.name) for p in pins] + ["attnbench"])
    bad = [n for n in names if never_carried(n)]
    if bad or sorted(names) != expected:
        raise UserError(f"wheelhouse: got wheels {sorted(names)}, expected {expected}"
                        + (f" and never {bad}" if bad else ""))
    return wheels


def manifest_text(own: Path, pins: Sequence[Pin], python_version: str,
                  platforms: Sequence[str], without: Sequence[str]) -> str:
    """``wheelhouse.txt``: the target (its first line: :func:`~attnbench.offline.install.
    check_target` reads it), what was left out and why each pin is there."""
    lines = [f"# attnbench wheelhouse for CPython {python_version} ({' '.join(platforms)})",
             "# install: python3 -m attnbench.offline install --prefix /tmp/attnbench",
             f"# left out: never carried (the box's own) torch, triton, nvidia-*, cuda-*; "
             f"the box has {' '.join(sorted(BOX_HAS))}"
             + (f"; asked: {' '.join(without)}" if without else ""),
             f"{own.name.split('-')[0]}=={own.name.split('-')[1]}  # this tree"]
    lines += [f"{pin}  # needed by {pin.needed_by}" for pin in pins]
    return "\n".join(lines) + "\n"


def size_mib(wheels: Sequence[Path]) -> float:
    return sum(w.stat().st_size for w in wheels) / 2**20
