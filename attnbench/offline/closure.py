"""Which distributions a wheelhouse carries: attnbench's closure for the box, minus what it has.

pip resolves the closure for the box's wheel tags (``pip install --dry-run --report``) but
judges environment markers by the interpreter it runs in; the walk here starts again from
attnbench's own requirements and follows only what the box's markers select, stopping at what
the box has (its own builds satisfy their own needs) and at what is never carried.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from attnbench.errors import UserError
from attnbench.offline.box import canonical, never_carried

try:
    from packaging.requirements import InvalidRequirement, Requirement
except ImportError:  # a bare python3 with only pip (building a wheelhouse on a laptop)
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement


@dataclass(frozen=True)
class Pin:
    """One carried distribution: ``name==version``, and the first requirement that reached it."""

    name: str
    version: str
    needed_by: str

    def __str__(self) -> str:
        return f"{self.name}=={self.version}"


def requirement(text: str, where: str) -> Requirement:
    try:
        return Requirement(text)
    except InvalidRequirement as exc:
        first = str(exc).splitlines()[0]
        raise UserError(f"{where}: requirement {text!r} is not PEP 508 ({first})") from None


def bare(req: Requirement) -> str:
    """The requirement without its marker, as pip gets it: the marker was judged for the box."""
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    return f"{req.name}{extras}{req.specifier}"


def applies(req: Requirement, environment: dict[str, str], extras: Iterable[str]) -> bool:
    """Whether a requirement of a distribution asked for with ``extras`` holds on the box."""
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**environment, "extra": extra}) for extra in {"", *extras})


def carried(resolved: dict[str, dict], roots: Iterable[str], environment: dict[str, str],
            box_has: Iterable[str], left_out: Iterable[str] = ()) -> list[Pin]:
    """The pins to carry, sorted by name: every distribution reached from ``roots`` (attnbench's
    requirements) through requirements whose markers hold in ``environment``, except what the
    box has, what is never carried and ``left_out`` (with what only they need).

    ``resolved``: canonical name -> ``{"name", "version", "requires_dist"}``, pip's report."""
    box, out = {canonical(n) for n in box_has}, {canonical(n) for n in left_out}
    pins: dict[str, Pin] = {}
    asked: dict[str, set[str]] = {}
    todo = [(req, "attnbench") for req in (requirement(r, "attnbench") for r in roots)
            if applies(req, environment, ())]
    while todo:
        req, by = todo.pop()
        name = canonical(req.name)
        if never_carried(name) or name in box or name in out:
            continue
        extras = asked.setdefault(name, set())
        if name in pins and set(req.extras) <= extras:
            continue
        meta = resolved.get(name)
        if meta is None:
            raise UserError(f"{name} (needed by {by}) is not in pip's resolution: its marker "
                            "holds on the box but not here; build with the box's Python")
        if not req.specifier.contains(meta["version"], prereleases=True):
            raise UserError(f"{name}: pip resolved {meta['version']}, {by} needs {req}")
        pins.setdefault(name, Pin(meta["name"], meta["version"], by))
        extras.update(req.extras)
        for line in meta.get("requires_dist") or ():
            child = requirement(line, f"{meta['name']} {meta['version']}")
            if applies(child, environment, extras):
                todo.append((child, meta["name"] + (f"[{','.join(sorted(extras))}]"
                                                    if extras else "")))
    return sorted(pins.values(), key=lambda pin: canonical(pin.name))


def resolved_from_report(report: dict) -> dict[str, dict]:
    """pip's ``--report`` (format 1): canonical name -> its metadata."""
    out = {}
    for item in report.get("install", ()):
        meta = item["metadata"]
        out[canonical(meta["name"])] = {"name": meta["name"], "version": meta["version"],
                                        "requires_dist": meta.get("requires_dist", [])}
    return out
