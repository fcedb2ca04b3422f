"""Run directories: ``results/<run-id>/manifest.json`` and ``records.jsonl``.

The journal is the truth (the Dask scheduler persists nothing): every record is appended as one
line and flushed to disk as it arrives, so an interrupted run loses at most the cases in flight.
Reopening a run tolerates a torn last line (cut off mid-write) by truncating it.

Load a run into pandas::

    import pandas as pd, attnbench.store as st
    df = pd.json_normalize(st.load_records("results/smoke-20261129-150203"))
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any, Iterable, Optional

from attnbench.errors import RunDirError
from attnbench.spec import Sweep

MANIFEST = "manifest.json"
RECORDS = "records.jsonl"


def default_run_dir(sweep: Sweep, root: Path = Path("results")) -> Path:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return root / f"{sweep.name}-{stamp}"


def latest_run_dir(sweep: Sweep, root: Path = Path("results")) -> Optional[Path]:
    """The newest run of this sweep (same name and same cases), for ``--resume``."""
    candidates = []
    for manifest in root.glob(f"{sweep.name}-*/{MANIFEST}"):
        try:
            data = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        if data.get("sweep", {}).get("digest") == sweep.digest:
            candidates.append((data.get("created", ""), manifest.parent))
    return max(candidates)[1] if candidates else None


def client_environment() -> dict[str, Any]:
    """Versions where the run is driven from (read from package metadata: the client never
    imports torch) and the project's git commit."""
    from attnbench.hardware.software import distribution_version, git_state

    out: dict[str, Any] = {"python": sys.version.split()[0]}
    for dist in ("torch", "triton", "dask", "distributed", "attnbench"):
        out[dist] = distribution_version(dist)
    return {**out, **git_state()}


# What makes two records' environments different enough to say so (see :meth:`RunStore.append`).
_ENV_KEYS = ("gpu_kind", "driver_version", "cuda_runtime", "cudnn", "nccl", "torch", "triton",
             "commit", "dirty", "sm_clock_max_mhz", "sm_clock_app_mhz", "memory_clock_max_mhz",
             "power_limit_w", "power_limit_enforced_w")


def record_environment(env: dict) -> dict[str, Any]:
    """The parts of a record's env that a comparison of numbers depends on."""
    flat = {**(env.get("identity") or {}), **(env.get("software") or {}),
            **{k: v for k, v in env.items() if not isinstance(v, dict)}}
    return {k: flat.get(k) for k in _ENV_KEYS}


class RunStore:
    """One run directory, opened for appending records."""

    def __init__(self, run_dir: Path, sweep: Sweep, command: list[str]):
        self.dir = Path(run_dir)
        self.sweep = sweep
        self.manifest_path = self.dir / MANIFEST
        self.records_path = self.dir / RECORDS
        self.dir.mkdir(parents=True, exist_ok=True)
        self.resume_note = ""
        """Set when this run directory is resumed in another environment than it began in."""
        client = client_environment()
        if self.manifest_path.exists():
            self.manifest = load_manifest(self.dir)
            old = self.manifest.get("sweep", {})
            if old.get("digest") != sweep.digest:
                raise RunDirError(
                    f"{self.manifest_path}: this run holds sweep {old.get('name')!r} "
                    f"({old.get('cases')} cases, digest {old.get('digest')}), not "
                    f"{sweep.name!r} ({len(sweep.cases)} cases, digest {sweep.digest}); "
                    "choose another --out to start a new run")
            self._note_resume(client)
        else:
            self.manifest = {
                "run_id": self.dir.name,
                "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "command": command,
                "sweep": {"name": sweep.name, "path": sweep.path, "digest": sweep.digest,
                          "cases": len(sweep.cases), "source": sweep.source,
                          "description": sweep.description},
                "options": sweep.options.to_dict(),
                "attnbench": client.get("attnbench"),
                "versions": client,
                "client_host": socket.gethostname(),
                "hosts": [],
                "devices": [],
                "environments": [],
            }
            self._write_manifest()
        self._repair_tail()
        self.done: dict[str, dict] = {r["id"]: r for r in load_records(self.dir)}
        self._fh = open(self.records_path, "a", encoding="utf-8")

    # -- journal --------------------------------------------------------------------------
    def _repair_tail(self) -> None:
        """Drop a torn last line so new records start on a line of their own."""
        if not self.records_path.exists():
            return
        with open(self.records_path, "rb+") as fh:
            data = fh.read()
            if not data or data.endswith(b"\n"):
                return
            cut = data.rfind(b"\n") + 1
            fh.truncate(cut)

    def _note_resume(self, client: dict[str, Any]) -> None:
        """A resumed run remembers where each session ran from, and says so when it differs."""
        from attnbench.hardware import environment_differences

        before = self.manifest.get("versions") or {}
        changed = environment_differences(before, client)
        if changed:
            self.resume_note = ("this run was started in another environment; its records "
                                "will mix the two: " + "; ".join(changed))
        self.manifest.setdefault("resumed", []).append(
            {"at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
             "versions": client, "differences": changed})
        self._write_manifest()

    def append(self, record: dict[str, Any]) -> Optional[str]:
        """Append one record (flushed and synced). Returns a note when the record comes from an
        environment (driver, CUDA, torch, clocks, commit, ...) the run has not seen before while
        earlier records of the same GPU kind came from another one."""
        self._fh.write(json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.done[record["id"]] = record
        return self._note_env(record.get("env") or {})

    def _note_env(self, env: dict) -> Optional[str]:
        from attnbench.hardware import environment_differences

        note = None
        host = env.get("host")
        device = {k: env.get(k) for k in ("host", "device", "gpu_kind", "device_name")}
        changed = False
        if env.get("device"):
            seen = self.manifest.setdefault("environments", [])
            current = record_environment(env)
            if current not in seen:
                # Against the same kind only: a sweep over H100s and A100s is two
                # environments by design.
                same_kind = [e for e in seen if e.get("gpu_kind") == current["gpu_kind"]]
                if same_kind:
                    differences = environment_differences(same_kind[-1], current)
                    if differences:
                        note = ("records now come from another environment than earlier ones: "
                                + "; ".join(differences))
                seen.append(current)
                changed = True
        if host and host not in self.manifest["hosts"]:
            self.manifest["hosts"].append(host)
            changed = True
        if env.get("device") and device not in self.manifest["devices"]:
            self.manifest["devices"].append(device)
            changed = True
        if changed:
            self._write_manifest()
        return note

    def _write_manifest(self) -> None:
        tmp = self.manifest_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.manifest, indent=2))
        os.replace(tmp, self.manifest_path)  # atomic: a reader never sees half a manifest

    def set_manifest(self, **fields: Any) -> None:
        self.manifest.update(fields)
        self._write_manifest()

    def pending(self) -> list:
        return [c for c in self.sweep.cases if c.id not in self.done]

    def close(self) -> None:
        self._fh.close()


def load_manifest(run_dir: Path | str) -> dict:
    path = Path(run_dir) / MANIFEST
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise RunDirError(f"{path}: no manifest; is {run_dir} a run directory made by "
                          "`attnbench run`?") from None
    except ValueError as exc:
        raise RunDirError(f"{path}: not valid JSON ({exc})") from None


def load_records(run_dir: Path | str) -> list[dict]:
    """All records of a run, last one per case id winning; a torn last line is skipped."""
    path = Path(run_dir) / RECORDS
    if not path.exists():
        if not (Path(run_dir) / MANIFEST).exists():
            raise RunDirError(f"{path}: not found; is {run_dir} a run directory made by "
                              "`attnbench run`?")
        return []
    by_id: dict[str, dict] = {}
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            if number == len(lines):
                break  # torn by an interruption mid-write
            raise RunDirError(f"{path}:{number}: not a JSON record") from None
        by_id[record["id"]] = record
    return list(by_id.values())


def records_frame(records: Iterable[dict]):
    """Records as a flat pandas DataFrame (columns like ``case.seqlen_q``, ``timing.fwd.tflops``)."""
    import pandas as pd

    return pd.json_normalize(list(records))
