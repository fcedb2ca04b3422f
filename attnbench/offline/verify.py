"""Is every requirement of attnbench met here, and are torch and triton the box's own?

A ``pip check`` limited to attnbench's closure: pip's own check looks at every distribution of
the box, and a box image carries unrelated conflicts that would drown ours. Walks the installed
metadata (``importlib.metadata``, in ``sys.path`` order, so ``PYTHONPATH=PREFIX`` comes first)
from attnbench's requirements, markers judged here; imports nothing but attnbench's root.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from attnbench.offline.box import canonical
from attnbench.offline.closure import applies, requirement

GPU_STACK = ("torch", "triton")
"""The box's own: present, and never from the prefix."""


@dataclass
class Verdict:
    """What :func:`check_environment` found: ``problems`` (one line each) and the
    distributions it met (name -> version)."""

    problems: list[str] = field(default_factory=list)
    met: dict[str, str] = field(default_factory=dict)


def _origin(module: str) -> str:
    spec = importlib.util.find_spec(module)
    return str(Path(spec.origin).parent) if spec and spec.origin else "?"


def check_environment(prefix: Path | None = None, root: str = "attnbench") -> Verdict:
    """Follow ``root``'s requirements; with ``prefix``, torch and triton must come from
    elsewhere (the box's own)."""
    verdict = Verdict()
    todo = [(requirement(root, "verify"), "you")]
    asked: dict[str, set[str]] = {}
    while todo:
        req, by = todo.pop()
        name = canonical(req.name)
        extras = asked.setdefault(name, set())
        if name in verdict.met and set(req.extras) <= extras:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            verdict.problems.append(f"{name}: missing, needed by {by} ({req})")
            verdict.met[name] = "missing"
            continue
        if not req.specifier.contains(dist.version, prereleases=True):
            verdict.problems.append(f"{name} {dist.version}: {by} needs {req}")
        verdict.met[name] = dist.version
        if name in GPU_STACK:
            continue  # the box's own build and its own business (NGC's torch lists no CUDA)
        extras.update(req.extras)
        for line in dist.requires or ():
            child = requirement(line, f"{name} {dist.version}")
            if applies(child, {}, extras):
                todo.append((child, f"{name} {dist.version}"))
    if importlib.util.find_spec("attnbench.kernels") is None:
        verdict.problems.append("attnbench.kernels: not importable (an attnbench without kernels)")
    for module in GPU_STACK if prefix else ():
        where = _origin(module)
        if where != "?" and Path(where).resolve().is_relative_to(Path(prefix).resolve()):
            verdict.problems.append(f"{module}: imported from {where}, inside the prefix; "
                                    "expected the box's own")
    return verdict


def summary(verdict: Verdict) -> str:
    """One line: what attnbench, torch and triton are here, and how many requirements hold."""
    where = ", ".join(f"{m} {verdict.met.get(m, '?')} ({_origin(m)})"
                      for m in ("attnbench", *GPU_STACK))
    return f"{len(verdict.met)} distributions met: {where}"
