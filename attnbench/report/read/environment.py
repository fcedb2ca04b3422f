"""Which hardware and software a run's numbers come from, read from its records' ``env``.

Records carry ``env.identity`` (the device as NVML names it: SKU, SM count, clocks, power
limit, driver) and ``env.software`` (CUDA runtime, cuDNN, NCCL, torch, triton, the project's
commit); records written before those existed carry only ``gpu_kind``, ``device_name``,
``torch`` and ``triton``. Everything here reads both: a field a record lacks is absent from
its view, so it reads as unknown and is never compared.

- :func:`environments`: the distinct environments of a run, most records first.
- :func:`run_warnings`: what differs between two runs' environments, one line each, for
  ``attnbench compare``.
- :func:`hardware_text` / :func:`software_text`: one environment in words, for the pages.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from attnbench.hardware import environment_differences
from attnbench.report.read.canonical import canonical_text

# The facts of one record's env that say what produced its numbers; per-process and per-device
# facts (host, pid, uuid, bus id, the clock at the moment of reading) are left out, so all the
# records of one machine set-up share one view.
TOP_KEYS = ("gpu_kind", "gpu_family", "device_name", "torch", "triton")
IDENTITY_KEYS = ("name", "form_factor", "memory_total_gib", "sm_count", "compute_capability",
                 "sm_clock_max_mhz", "sm_clock_app_mhz", "memory_clock_max_mhz",
                 "memory_clock_app_mhz", "power_limit_w", "power_limit_enforced_w", "ecc_enabled",
                 "driver_version", "cuda_driver_version")
SOFTWARE_KEYS = ("python", "torch", "triton", "cuda_runtime", "cudnn", "nccl", "driver_version",
                 "cuda_driver_version", "commit", "commit_date", "dirty")
# environment_differences labels that are settings of the card: they follow from the GPU kind,
# so across two kinds they are no news (the kinds differ, and compare says so).
CARD_SETTINGS = ("clocks", "power limit")


def env_view(env: Any) -> dict[str, Any]:
    """The facts of one record's ``env`` (flat; a key the record lacks is absent)."""
    if not isinstance(env, dict):
        return {}
    view: dict[str, Any] = {}
    for part, keys in ((env.get("identity"), IDENTITY_KEYS), (env.get("software"), SOFTWARE_KEYS)):
        if isinstance(part, dict):
            view.update({k: part[k] for k in keys if k in part and part[k] is not None})
    view.update({k: env[k] for k in TOP_KEYS if env.get(k) is not None})
    return view


@dataclass
class Environment:
    """One distinct environment of a run: its view, how many records and devices had it."""

    view: dict[str, Any]
    records: int = 0
    devices: set = field(default_factory=set)


def _view_key(view: dict[str, Any]) -> bytes:
    """A view's text, equal only for equal views (one a record, 10^6 records: orjson's ~1 us,
    not json's ~5, where installed); a value JSON cannot hold (a record made in memory) is
    written as its ``str``, as before."""
    try:
        return canonical_text(view)
    except (TypeError, ValueError):
        return b"\1" + json.dumps(view, sort_keys=True, default=str).encode("utf-8", "replace")


class EnvironmentTally:
    """The distinct environments of records added one at a time (what :func:`environments`
    returns, without holding the records: a report reads its journal once, streamed)."""

    def __init__(self) -> None:
        self.found: dict[bytes, Environment] = {}
        self.counts: Counter = Counter()

    def add(self, rec: Any) -> None:
        env = rec.get("env") if isinstance(rec, dict) else None
        view = env_view(env)
        if not view:
            return
        key = _view_key(view)
        group = self.found.setdefault(key, Environment(view))
        group.records += 1
        self.counts[key] += 1
        ident = env.get("identity") or {}
        group.devices.add((env.get("host"), ident.get("uuid") or env.get("device")))

    def merge(self, other: "EnvironmentTally") -> None:
        """Add what ``other`` tallied of the records after these (order matters: ties in
        :meth:`result` go to the environment seen first)."""
        for key, group in other.found.items():
            mine = self.found.setdefault(key, Environment(group.view))
            mine.records += group.records
            mine.devices |= group.devices
            self.counts[key] += other.counts[key]

    def result(self) -> list[Environment]:
        return [self.found[key] for key, _ in self.counts.most_common()]


def environments(records: Iterable[dict[str, Any]]) -> list[Environment]:
    """The run's distinct environments, most records first (ties: first seen). Records that
    say nothing about a device (a case that died before reaching one) are not counted."""
    tally = EnvironmentTally()
    for rec in records:
        tally.add(rec)
    return tally.result()


def representative(records: Iterable[Any]) -> dict[str, Any]:
    """The view that stands for a run in a comparison: its most common environment.

    A run is normally one environment per GPU kind; a resumed run after an upgrade, or a sweep
    over several kinds, has more. The most common one is what most of its numbers came from,
    which is what "run A against run B" means; :func:`mixed_kinds` says when a run mixes
    environments within one GPU kind, so that a reader knows the representative is not all."""
    found = _found(records)
    return dict(found[0].view) if found else {}


def mixed_kinds(records: Iterable[Any]) -> dict[str, int]:
    """GPU kind -> number of environments, for the kinds whose records come from more than one
    (driver, CUDA, torch, clocks or commit changed mid-run)."""
    per_kind: Counter = Counter(str(e.view.get("gpu_kind", "?")) for e in _found(records))
    return {kind: n for kind, n in sorted(per_kind.items()) if n > 1}


def _found(given: Iterable[Any]) -> list[Environment]:
    """Environments as given (a loaded run's, :attr:`~attnbench.report.read.data.Run.environments`),
    or those of the records given."""
    given = list(given) if not isinstance(given, list) else given
    if given and all(isinstance(e, Environment) for e in given):
        return given
    return environments(given)


def run_warnings(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """One line per watched difference between two runs' representative views:
    ``runs differ in torch: 2.13.0 -> 2.14.0``. Clocks and power limits are compared only
    between views of the same GPU kind (across kinds they differ by design)."""
    lines = environment_differences(a, b)
    if a.get("gpu_kind") != b.get("gpu_kind"):
        lines = [line for line in lines if line.split(":", 1)[0] not in CARD_SETTINGS]
    return [f"runs differ in {line}" for line in lines]


def warned_labels(warnings: Iterable[str]) -> set[str]:
    """The labels (``torch``, ``driver``, ...) that :func:`run_warnings` lines name."""
    return {w.removeprefix("runs differ in ").split(":", 1)[0] for w in warnings}


def _num(value: Any, unit: str = "", digits: int = 4) -> str:
    if isinstance(value, float):
        value = f"{value:.{digits}g}"
    return f"{value}{unit}"


def kind_text(view: dict[str, Any]) -> str:
    """``H100-SXM5-80GB (family H100)``; the family only where it adds something."""
    kind, family = view.get("gpu_kind"), view.get("gpu_family")
    if not kind:
        return "unknown GPU kind"
    return f"{kind} (family {family})" if family and family != kind else str(kind)


def hardware_text(view: dict[str, Any]) -> str:
    """The device of one environment in words; only what its records say."""
    parts = [view.get("name") or view.get("device_name")]
    if view.get("form_factor"):
        parts.append(str(view["form_factor"]))
    if view.get("memory_total_gib") is not None:
        parts.append(_num(view["memory_total_gib"], " GiB"))
    if view.get("sm_count") is not None:
        parts.append(f"{view['sm_count']} SMs")
    if view.get("compute_capability"):
        parts.append(f"compute capability {view['compute_capability']}")
    sm = _clock("SM", view.get("sm_clock_max_mhz"), view.get("sm_clock_app_mhz"))
    mem = _clock("memory", view.get("memory_clock_max_mhz"), view.get("memory_clock_app_mhz"))
    parts += [sm, mem]
    limit, enforced = view.get("power_limit_w"), view.get("power_limit_enforced_w")
    if limit is not None or enforced is not None:
        text = f"power limit {_num(limit if limit is not None else enforced, ' W')}"
        if limit is not None and enforced is not None and enforced != limit:
            text += f" (enforced {_num(enforced, ' W')})"
        parts.append(text)
    if view.get("ecc_enabled") is not None:
        parts.append("ECC on" if view["ecc_enabled"] else "ECC off")
    return kind_text(view) + (": " + ", ".join(p for p in parts if p) if any(parts) else "")


def _clock(what: str, max_mhz: Optional[int], app_mhz: Optional[int]) -> str:
    if max_mhz is None and app_mhz is None:
        return ""
    if max_mhz is None:
        return f"{what} clock applications {app_mhz} MHz"
    app = f" (applications {app_mhz})" if app_mhz is not None and app_mhz != max_mhz else ""
    return f"{what} clock max {max_mhz} MHz{app}"


def software_text(view: dict[str, Any]) -> str:
    """Driver, CUDA, cuDNN, NCCL, torch, triton and the project's commit; "" when unknown."""
    parts = []
    if view.get("driver_version"):
        cuda = view.get("cuda_driver_version")
        parts.append(f"driver {view['driver_version']}" + (f" (CUDA {cuda})" if cuda else ""))
    for key, name in (("cuda_runtime", "CUDA runtime"), ("cudnn", "cuDNN"), ("nccl", "NCCL"),
                      ("torch", "torch"), ("triton", "triton"), ("python", "Python")):
        if view.get(key):
            parts.append(f"{name} {view[key]}")
    if view.get("commit"):
        dirty = {True: " (dirty)", False: ""}.get(view.get("dirty"), " (dirty: unknown)")
        parts.append(f"commit {str(view['commit'])[:12]}{dirty}")
    return ", ".join(parts)
