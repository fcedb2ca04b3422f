"""Run directories: ``results/<run-id>/manifest.json`` and ``records.jsonl``.

The journal is the truth (the Dask scheduler persists nothing): every record is appended as one
line and flushed to disk as it arrives, so an interrupted run loses at most the cases in flight.
Reopening a run tolerates a torn last line (cut off mid-write) by truncating it; a last line that
lost only its newline is a whole record and is kept. One ``attnbench run`` at a time appends to a
run directory (:class:`RunLock`). Run directories travel between people (``compare``), so what
is read from them is checked field by field (:func:`check_record`, :func:`check_manifest`):
a bad value is one line naming the file, the line and the field, never a traceback.

Load a run into pandas::

    import pandas as pd, attnbench.store as st
    df = pd.json_normalize(st.load_records("results/smoke-20261129-150203"))
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Any, Iterable, Optional

from attnbench.errors import RunDirError, SweepError, printable, short_repr, shown_key
from attnbench.records import VERDICTS
from attnbench.spec import Case, Sweep, check_case_dict, check_options_dict
from attnbench.validation import parse_json

MANIFEST = "manifest.json"
RECORDS = "records.jsonl"
LOCK = ".lock"
"""Held (``flock``) by the one ``attnbench run`` appending to a run directory; names it."""
RETRIED = ("lost", "skipped")
"""Infrastructure verdicts: the case never reached a device (no worker could run it) or its
worker died under it. A resumed run runs these cases again (``--retry`` adds verdicts)."""


def default_run_dir(sweep: Sweep, root: Path = Path("results")) -> Path:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return root / f"{sweep.name}-{stamp}"


def latest_run_dir(sweep: Sweep, root: Path = Path("results")) -> Optional[Path]:
    """The newest run of this sweep (same name and same cases), for ``--resume``."""
    candidates = []
    for manifest in root.glob(f"{sweep.name}-*/{MANIFEST}"):
        try:
            data = load_manifest(manifest.parent)
        except RunDirError:
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


class RunLock:
    """An exclusive ``flock`` on ``<run>/.lock`` for as long as a run appends to the directory.
    The file names its holder (pid, host, command, since when), which a second ``attnbench run``
    on the same directory prints when it is refused. The kernel drops the lock when the holder
    exits, however it exits."""

    def __init__(self, directory: Path):
        self.path = Path(directory) / LOCK
        self._fh = None

    def acquire(self, command: list[str]) -> None:
        try:
            fh = open(self.path, "a+", encoding="utf-8")  # "a+": a holder's note stays readable
        except OSError as exc:
            raise RunDirError(f"{self.path}: cannot create the run's lock file: "
                              f"{exc.strerror or exc}") from None
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            holder = fh.read(2000).strip()
            fh.close()
            try:
                info = json.loads(holder)
                holder = (f"pid {info['pid']} on {info['host']} since {info['since']}: "
                          f"{' '.join(map(str, info['command']))}")
            except (ValueError, TypeError, KeyError):
                holder = holder or "its holder is starting"
            raise RunDirError(f"{self.path.parent}: in use by another attnbench run "
                              f"({printable(holder, 300)}); wait for it to finish or choose "
                              "another --out") from None
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": _now(),
                             "command": [str(c) for c in command]}))
        fh.flush()
        self._fh = fh

    @property
    def held(self) -> bool:
        return self._fh is not None

    def release(self) -> None:
        if self._fh is not None:
            self._fh.close()  # closing the descriptor drops the flock
            self._fh = None


class RunStore:
    """One run directory, opened for appending records: locked against a second run, its
    manifest and journal checked (:func:`load_manifest`, :func:`load_records`).

    ``retry``: verdicts whose cases run again besides :data:`RETRIED` (``--retry timeout``).
    Refused with :class:`RunDirError` (exit 2), before anything is written: a path that is a
    file or an unrelated non-empty directory, a directory another run holds, a run of another
    sweep or with other options."""

    def __init__(self, run_dir: Path, sweep: Sweep, command: list[str],
                 retry: Iterable[str] = ()):
        self.dir = Path(run_dir)
        self.sweep = sweep
        self.retry = frozenset(RETRIED) | frozenset(retry)
        self.manifest_path = self.dir / MANIFEST
        self.records_path = self.dir / RECORDS
        self.resume_note = ""
        """Set when this run directory is resumed in another environment than it began in."""
        self.created = self._make_dir()
        """True when this run made the directory (and may remove it again, unused)."""
        self.new = False
        """True when this run began the run directory (wrote its manifest)."""
        self._lock = RunLock(self.dir)
        self._fh = None
        try:
            self._lock.acquire(command)
            self._open(command)
        except BaseException:
            self.close(discard_unused=True)
            raise

    def _make_dir(self) -> bool:
        if self.dir.exists() and not self.dir.is_dir():
            raise RunDirError(f"{self.dir}: exists and is not a directory; --out names a run "
                              "directory")
        if self.dir.is_dir():
            if not (self.dir / MANIFEST).exists() and any(
                    p.name != LOCK for p in self.dir.iterdir()):
                raise RunDirError(f"{self.dir}: a non-empty directory that is not a run "
                                  "directory (no manifest.json); choose a new or empty --out")
            return False
        try:
            self.dir.mkdir(parents=True)
        except OSError as exc:
            raise RunDirError(f"{self.dir}: cannot create the run directory: "
                              f"{exc.strerror or exc}") from None
        return True

    def _open(self, command: list[str]) -> None:
        sweep = self.sweep
        client = client_environment()
        if self.manifest_path.exists():
            self.manifest = load_manifest(self.dir)
            old = self.manifest.get("sweep", {})
            if old.get("digest") != sweep.digest:
                raise RunDirError(
                    f"{self.manifest_path}: this run holds sweep {short_repr(old.get('name'))} "
                    f"({old.get('cases')} cases, digest {short_repr(old.get('digest'))}), not "
                    f"{sweep.name!r} ({len(sweep.cases)} cases, digest {sweep.digest}); "
                    "choose another --out to start a new run")
            self._check_options()
            self._note_resume(client)
        else:
            self.manifest = {
                "run_id": self.dir.name,
                "created": _now(),
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
            self.new = True
        if self.records_path.exists() and not self.records_path.is_file():
            raise RunDirError(f"{self.records_path}: not a file; the journal must be one")
        self._repair_tail()
        self.done: dict[str, dict] = {r["id"]: r for r in load_records(self.dir)}
        try:
            self._fh = open(self.records_path, "a", encoding="utf-8")
        except OSError as exc:
            raise RunDirError(f"{self.records_path}: cannot append: "
                              f"{exc.strerror or exc}") from None

    def _check_options(self) -> None:
        """A resumed run keeps its options: records timed or judged under other settings would
        mix with the earlier ones, and the manifest would name only one set."""
        old = self.manifest.get("options")
        if old is None:
            return
        before = check_options_dict(f"{self.manifest_path}: options", old).to_dict()
        now = self.sweep.options.to_dict()
        changed = _differences(before, now)
        if changed:
            raise RunDirError(f"{self.manifest_path}: this run was started with other options "
                              f"({'; '.join(changed)}); restore them in {self.sweep.path} or "
                              "choose another --out")

    # -- journal --------------------------------------------------------------------------
    def _repair_tail(self) -> None:
        """Drop a torn last line so new records start on a line of their own; a last line that
        lost only its newline (a complete record) is kept and ended."""
        if not self.records_path.exists():
            return
        try:
            with open(self.records_path, "rb+") as fh:
                data = fh.read()
                if not data or data.endswith(b"\n"):
                    return
                cut = data.rfind(b"\n") + 1
                try:
                    check_record("", parse_json(data[cut:].decode("utf-8")))
                except (ValueError, RunDirError):
                    fh.truncate(cut)
                else:
                    fh.write(b"\n")
        except OSError as exc:
            raise RunDirError(f"{self.records_path}: cannot repair the journal's last line: "
                              f"{exc.strerror or exc}") from None

    def _note_resume(self, client: dict[str, Any]) -> None:
        """A resumed run remembers where each session ran from, and says so when it differs."""
        from attnbench.hardware import environment_differences

        before = self.manifest.get("versions") or {}
        changed = environment_differences(before, client)
        if changed:
            self.resume_note = ("this run was started in another environment; its records "
                                "will mix the two: " + "; ".join(changed))
        self.manifest.setdefault("resumed", []).append(
            {"at": _now(), "versions": client, "differences": changed})
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
        tmp = self.manifest_path.with_name(f"{MANIFEST}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(self.manifest, indent=2))
            os.replace(tmp, self.manifest_path)  # atomic: a reader never sees half a manifest
        except OSError as exc:
            raise RunDirError(f"{self.manifest_path}: cannot write: "
                              f"{exc.strerror or exc}") from None

    def set_manifest(self, **fields: Any) -> None:
        self.manifest.update(fields)
        self._write_manifest()

    def pending(self) -> list[Case]:
        """The cases to run now: those chosen by ``--case`` (again, if done), else every case
        without a record or whose record's verdict is retried (:data:`RETRIED`, ``retry``)."""
        if self.sweep.selected:
            chosen = set(self.sweep.selected)
            return [c for c in self.sweep.cases if c.id in chosen]
        return [c for c in self.sweep.cases
                if c.id not in self.done or self.done[c.id]["verdict"] in self.retry]

    def attempt(self, case: Case) -> int:
        """The attempt number of the next record of ``case`` (1, or the last record's + 1)."""
        before = self.done.get(case.id)
        return 1 if before is None else int(before.get("attempt") or 1) + 1

    def records(self) -> tuple[list[dict], int]:
        """The records of this sweep's cases, and how many other records the journal holds
        (pasted from another run; they are neither shown nor counted)."""
        ids = {c.id for c in self.sweep.cases}
        mine = [r for r in self.done.values() if r["id"] in ids]
        return mine, len(self.done) - len(mine)

    def close(self, discard_unused: bool = False) -> None:
        """Close the journal and release the lock. ``discard_unused``: a run directory this run
        began and wrote no record into is removed again (a run that could not start leaves
        nothing behind: the directory if it made it, else the files it made)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        unused = (discard_unused and (self.created or self.new) and self._lock.held
                  and not (self.records_path.is_file() and self.records_path.stat().st_size))
        if unused and self.created:
            shutil.rmtree(self.dir, ignore_errors=True)
        elif unused:
            for path in (self.manifest_path, self.records_path, self._lock.path):
                if path.is_file():
                    path.unlink()
        self._lock.release()


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    out = []
    for key in dict.fromkeys([*old, *new]):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key} {a} -> {b}")
    return out


# -- reading a run directory: every value checked, every mistake one line ----------------------


_SCALAR = (str, int, float, bool, type(None))


def _bad(where: str, value: Any, expected: str) -> RunDirError:
    return RunDirError(f"{where}: got {short_repr(value)}, expected {expected}")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# Kinds of value a known field may hold (None is always allowed: "not recorded").
TEXT, NUMBER, FLAG, SCALAR, NUMBERS = "a string", "a number", "true or false", "a scalar", \
    "a list of numbers"
_KINDS = {TEXT: lambda v: isinstance(v, str), NUMBER: _number, FLAG: lambda v: isinstance(v, bool),
          SCALAR: lambda v: isinstance(v, _SCALAR),
          NUMBERS: lambda v: isinstance(v, list) and all(map(_number, v))}
_STATS = {**{k: NUMBER for k in ("median_ms", "q1_ms", "q3_ms", "min_ms", "n", "tflops",
                                 "pct_peak", "pct_measured_peak", "gbps", "pct_peak_bandwidth",
                                 "peak_memory_bytes",
                                 "calls_per_sample", "warmup_calls", "warmup_ms")},
          "samples_ms": NUMBERS, "noisy": FLAG}
_TIMING = {"clock": TEXT, "mode": TEXT, "note": TEXT,
           **{k: NUMBER for k in ("world_size", "l2_flush_bytes", "flops_fwd", "flops_bwd",
                                  "bytes_fwd", "bytes_bwd", "peak_tflops",
                                  "measured_peak_tflops", "peak_bandwidth_gbs")}}
_METRICS = {k: SCALAR for k in ("rel_l2", "max_abs", "cosine", "nonfinite", "baseline_rel_l2",
                                "ratio", "bound", "value", "baseline")}
_CRASH = {"signal": TEXT, "stderr_tail": TEXT, "traceback": TEXT, "exit_code": NUMBER,
          "rank": NUMBER}
_CHECK = {"check": TEXT, "tensor": TEXT, "metric": TEXT, "value": SCALAR, "bound": SCALAR,
          "passed": SCALAR, "note": TEXT}
_ENV = {**{k: TEXT for k in ("host", "python", "attnbench", "device", "device_name", "gpu_kind",
                             "gpu_family", "torch", "triton", "worker", "worker_kind")},
        "pid": NUMBER}
_IDENTITY = {**{k: TEXT for k in ("name", "form_factor", "compute_capability", "driver_version",
                                  "cuda_driver_version", "uuid", "pci_bus_id", "device_type")},
             **{k: SCALAR for k in ("memory_total_gib", "memory_total_bytes", "sm_count",
                                    "sm_clock_max_mhz", "sm_clock_app_mhz", "memory_clock_max_mhz",
                                    "memory_clock_app_mhz", "power_limit_w",
                                    "power_limit_enforced_w", "ecc_enabled", "index")}}
_SOFTWARE = {**{k: TEXT for k in ("python", "torch", "triton", "cuda_runtime", "cudnn", "nccl",
                                  "driver_version", "cuda_driver_version", "commit",
                                  "attnbench")}, "dirty": SCALAR}
_RECORD = {**{k: TEXT for k in ("label", "features", "reason", "started")},
           "duration_s": NUMBER, "wall_s": NUMBER}


def _obj(where: str, value: Any, fields: dict[str, str]) -> dict:
    """``value`` is None or an object whose known ``fields`` hold their kind (or null); other
    keys are left alone (a newer attnbench may add them). Returns it, ``{}`` for None."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad(where, value, "an object")
    for key, kind in fields.items():
        v = value.get(key)
        if v is not None and not _KINDS[kind](v):
            raise _bad(f"{where}.{key}", v, kind)
    return value


def _objects(where: str, value: Any, fields: dict[str, str]) -> None:
    """An object of such objects (``accuracy.tensors``: tensor -> metrics)."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise _bad(where, value, "an object")
    for key, v in value.items():
        _obj(f"{where}.{shown_key(key)}", v, fields)


def check_record(where: str, rec: Any) -> dict:
    """One journal record checked against the schema of :mod:`attnbench.records`, as far as
    anything downstream reads it (``show``, reports, ``compare``, resume): its case through the
    sweep's own field rules, every other known field by kind. Fields it lacks are unknown;
    fields this version does not know are ignored. Raises :class:`RunDirError` naming the
    field. ``where``: ``FILE:LINE: `` (ends with a separator)."""
    if not isinstance(rec, dict):
        raise RunDirError(f"{where}got {short_repr(rec)}, expected a record (a JSON object, see "
                          "attnbench/records.py)")
    at = where.rstrip() + (" " if where else "")
    rid = rec.get("id")
    if not isinstance(rid, str) or not 0 < len(rid) <= 64 or not rid.isprintable():
        raise _bad(f"{at}id", rid, "a case id (a string of at most 64 characters)")
    try:
        check_case_dict(f"{at}case", rec.get("case"))
    except SweepError as exc:
        raise RunDirError(str(exc)) from None
    if rec.get("verdict") not in VERDICTS:
        raise _bad(f"{at}verdict", rec.get("verdict"), "one of " + ", ".join(VERDICTS))
    for key, kind in _RECORD.items():
        if rec.get(key) is not None and not _KINDS[kind](rec[key]):
            raise _bad(f"{at}{key}", rec[key], kind)
    attempt = rec.get("attempt")
    if attempt is not None and not (isinstance(attempt, int) and not isinstance(attempt, bool)
                                    and attempt >= 1):
        raise _bad(f"{at}attempt", attempt, "a positive integer")
    checks = rec.get("checks")
    if checks is not None and not isinstance(checks, list):
        raise _bad(f"{at}checks", checks, "a list of checks")
    for i, check in enumerate(checks or []):
        _obj(f"{at}checks[{i}]", check, _CHECK)
    _obj(f"{at}crash", rec.get("crash"), _CRASH)
    timing = _obj(f"{at}timing", rec.get("timing"), _TIMING)
    for d in ("fwd", "bwd"):
        _obj(f"{at}timing.{d}", timing.get(d), _STATS)
    accuracy = _obj(f"{at}accuracy", rec.get("accuracy"), {"reference": TEXT, "backward": TEXT})
    for section in ("tensors", "identities", "parity"):
        _objects(f"{at}accuracy.{section}", accuracy.get(section), _METRICS)
    env = _obj(f"{at}env", rec.get("env"), _ENV)
    _obj(f"{at}env.identity", env.get("identity"), _IDENTITY)
    _obj(f"{at}env.software", env.get("software"), _SOFTWARE)
    return rec


_MANIFEST = {**{k: TEXT for k in ("run_id", "created", "attnbench", "client_host")}}
_MANIFEST_SWEEP = {**{k: TEXT for k in ("name", "path", "digest", "source", "description")},
                   "cases": NUMBER}
_DEVICE = {k: TEXT for k in ("host", "device", "gpu_kind", "device_name")}


def check_manifest(path: Path, data: Any) -> dict:
    """A manifest checked by kind, as far as anything reads it; unknown keys are kept."""
    if not isinstance(data, dict):
        raise _bad(f"{path}", data, "a JSON object (the run's manifest)")
    at = f"{path}: "
    for key, kind in _MANIFEST.items():
        if data.get(key) is not None and not _KINDS[kind](data[key]):
            raise _bad(f"{at}{key}", data[key], kind)
    _obj(f"{at}sweep", data.get("sweep"), _MANIFEST_SWEEP)
    for key in ("command", "hosts"):
        value = data.get(key)
        if value is not None and not (isinstance(value, list)
                                      and all(isinstance(v, str) for v in value)):
            raise _bad(f"{at}{key}", value, "a list of strings")
    environment = {**{k: SCALAR for k in _ENV_KEYS}, "gpu_kind": TEXT}
    for key, fields in (("devices", _DEVICE), ("environments", environment), ("resumed", {})):
        value = data.get(key)
        if value is not None and not isinstance(value, list):
            raise _bad(f"{at}{key}", value, "a list of objects")
        for i, item in enumerate(value or []):
            if not isinstance(item, dict):
                raise _bad(f"{at}{key}[{i}]", item, "an object")
            _obj(f"{at}{key}[{i}]", item, fields)
    versions = _obj(f"{at}versions", data.get("versions"), {})
    for key, v in versions.items():
        if not isinstance(v, _SCALAR):
            raise _bad(f"{at}versions.{shown_key(key)}", v, SCALAR)
    if data.get("options") is not None:
        try:
            check_options_dict(f"{at}options", data["options"])
        except SweepError as exc:
            raise RunDirError(str(exc)) from None
    return data


def load_manifest(run_dir: Path | str) -> dict:
    path = Path(run_dir) / MANIFEST
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RunDirError(f"{path}: no manifest; is {run_dir} a run directory made by "
                          "`attnbench run`?") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RunDirError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        data = parse_json(text)
    except ValueError as exc:
        raise RunDirError(f"{path}: not valid JSON ({printable(exc, 200)})") from None
    return check_manifest(path, data)


def load_records(run_dir: Path | str) -> list[dict]:
    """All records of a run, last one per case id winning; a torn last line is skipped. Every
    record is checked (:func:`check_record`); the first bad one is a :class:`RunDirError`
    naming its line and field."""
    path = Path(run_dir) / RECORDS
    if not path.exists():
        if not (Path(run_dir) / MANIFEST).exists():
            raise RunDirError(f"{path}: not found; is {run_dir} a run directory made by "
                              "`attnbench run`?")
        return []
    if not path.is_file():
        raise RunDirError(f"{path}: not a file; the journal must be one")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RunDirError(f"{path}: cannot read: {exc.strerror or exc}") from None
    by_id: dict[str, dict] = {}
    lines = data.split(b"\n")
    torn = lines[-1] if lines[-1] else None  # a last line without its newline
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            record = parse_json(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            if raw is torn:
                break  # torn by an interruption mid-write
            why = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else "not a JSON record"
            raise RunDirError(f"{path}:{number}: {why} ({printable(exc, 200)})") from None
        check_record(f"{path}:{number}: ", record)
        by_id[record["id"]] = record
    return list(by_id.values())


def records_frame(records: Iterable[dict]):
    """Records as a flat pandas DataFrame (columns like ``case.seqlen_q``,
    ``timing.fwd.tflops``)."""
    import pandas as pd

    return pd.json_normalize(list(records))
