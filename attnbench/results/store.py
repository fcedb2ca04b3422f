"""Run directories: ``results/<run-id>/manifest.json`` and ``records.jsonl``.

The journal is the truth (the Dask scheduler persists nothing): every record is appended as one
line and flushed with the batch it arrives in (synced to disk within about a second), so an
interrupted run loses at most the cases in flight (a killed one, also the records of the batch
being written: those cases are pending again).
Reopening a run tolerates a torn last line (cut off mid-write) by truncating it; a last line that
lost only its newline is a whole record and is kept. One ``attnbench run`` at a time appends to a
run directory (:class:`RunLock`). Run directories travel between people (``compare``), so what
is read from them is checked field by field (:func:`check_record`, :func:`check_manifest`):
a bad value is one line naming the file, the line and the field, never a traceback.

Load a run into pandas::

    import pandas as pd, attnbench.results.store as st
    df = pd.json_normalize(st.load_records("results/smoke-20261129-150203"))
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import io
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

from attnbench.errors import (DiskError, RunDirError, UserError, os_error_text, printable,
                              short_repr)
from attnbench.results.files import open_append, open_update, refusal, write_atomic
from attnbench.results.journal import MAX_LINE_BYTES, fit_line, journal_records
from attnbench.results.ledger import Entry, last_records, read_ledger
from attnbench.results.lock import LOCK, RunLock, utc_now as _now
from attnbench.results.schema import ENV_KEYS, check_manifest, check_record
from attnbench.sweep.case import Case
from attnbench.sweep.load import Sweep, parse_sweep
from attnbench.sweep.options import check_options_dict
from attnbench.validation import parse_json, read_bounded

MANIFEST = "manifest.json"
RECORDS = "records.jsonl"
SYNC_INTERVAL_S = 0.2
"""At most this long between fsyncs of the journal while records arrive. fsync, which only a
power loss or kernel crash needs, is shared by the records of a batch: one fsync per record
cost 8 ms on this machine and held the journal to 122 appends/s
(benchmarks/scale_simulation.py). A record lost that way is a case pending again, never a
wrong one."""
MAX_MANIFEST_BYTES = 16 << 20
"""The largest manifest read (16 MiB): one is a few KB, growing by about 1 KB per resume and
per new environment, so this is thousands of resumes; a larger one was not written by
attnbench and is refused in one line rather than read."""
RETRIED = ("lost", "skipped")
"""Infrastructure verdicts: the case never reached a device (no worker could run it) or its
worker died under it. A resumed run runs these cases again (``--retry`` adds verdicts)."""


def default_run_dir(sweep: Sweep, root: Path = Path("results")) -> Path:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return root / f"{sweep.name}-{stamp}"


def latest_run_dir(sweep: Sweep, root: Path = Path("results")) -> Optional[Path]:
    """The newest run of this sweep, for ``--resume``: one with the same cases, else the
    newest of the same name that the sweep extends (it has every case that run recorded)."""
    same, grown = [], []
    for manifest in root.glob(f"{sweep.name}-*/{MANIFEST}"):
        try:
            data = load_manifest(manifest.parent)
            if data.get("sweep", {}).get("digest") == sweep.digest:
                same.append((data.get("created", ""), manifest.parent))
            elif data.get("sweep", {}).get("name") == sweep.name:
                grown.append((data.get("created", ""), manifest.parent))
        except RunDirError:
            continue
    if same:
        return max(same)[1]
    ids = {c.id for c in sweep.cases}
    for _, run_dir in sorted(grown, reverse=True):
        try:  # streamed and stopped at the first stranger: a 10^6-record journal is ~7.5 GB read
            if not any(r["id"] not in ids for r in _stream_records(run_dir)):
                return run_dir
        except RunDirError:
            continue
    return None


def outside(records: Iterable[dict], sweep: Sweep) -> list[dict]:
    """The records of cases ``sweep`` does not have."""
    ids = {c.id for c in sweep.cases}
    return [r for r in records if r["id"] not in ids]


def client_environment() -> dict[str, Any]:
    """Versions where the run is driven from (read from package metadata: the client never
    imports torch) and the project's git commit."""
    from attnbench.hardware.software import distribution_version, git_state

    out: dict[str, Any] = {"python": sys.version.split()[0]}
    for dist in ("torch", "triton", "dask", "distributed", "attnbench"):
        out[dist] = distribution_version(dist)
    return {**out, **git_state()}


def record_environment(env: dict) -> dict[str, Any]:
    """The parts of a record's env that a comparison of numbers depends on."""
    flat = {**(env.get("identity") or {}), **(env.get("software") or {}),
            **{k: v for k, v in env.items() if not isinstance(v, dict)}}
    return {k: flat.get(k) for k in ENV_KEYS}


class RunStore:
    """One run directory, opened for appending records: locked against a second run, its
    manifest and journal checked (:func:`load_manifest`, :func:`load_records`).

    ``retry``: verdicts whose cases run again besides :data:`RETRIED` (``--retry timeout``).
    Refused with :class:`RunDirError` (exit 2), before anything is written: a path that is a
    file or an unrelated non-empty directory, a directory another run holds, a run with
    recorded cases the sweep lacks or with other options. A sweep with more cases than the run
    extends it (new axis values: only the new cases are pending)."""

    def __init__(self, run_dir: Path, sweep: Sweep, command: list[str],
                 retry: Iterable[str] = (), lock_wait_s: float = 0.0,
                 lock: Optional[RunLock] = None, **lock_note: Any):
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
        self._lock = lock or RunLock(self.dir)
        """``lock``: one already held (a driver's, inherited from its submit's claim)."""
        self._fh = None
        self._synced = 0.0
        self._dirty = False
        self._broken: Optional[DiskError] = None
        """Set by the first write the disk refused: nothing more is appended after it."""
        self._envs_noted: set[tuple] = set()
        """Environments :meth:`_note_env` has taken in: a record from one of them changes
        nothing, and is known so without scanning the manifest's lists (one entry a device:
        at 288 GPUs that scan was 0.17 ms a record, a fifth of the driver's time per case)."""
        try:
            if lock is None:
                self._lock.acquire(command, lock_wait_s, **lock_note)
            self._open(command)
        except BaseException:
            self.close(discard_unused=True)
            raise

    @property
    def lock(self) -> RunLock:
        """The run directory's lock (its token names this writer; ``lost`` if taken over)."""
        return self._lock

    def _make_dir(self) -> bool:
        if self.dir.exists() and not self.dir.is_dir():
            raise RunDirError(f"{self.dir}: exists and is not a directory; --out names a run "
                              "directory")
        if self.dir.is_dir():
            if not (self.dir / MANIFEST).exists() and any(
                    not p.name.startswith((LOCK, ".clock.")) for p in self.dir.iterdir()):
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
            self._check_growth()
            self._check_options()
            self._note_resume(client)
        else:
            self.manifest = {
                "run_id": self.dir.name,
                "created": _now(),
                "command": command,
                "sweep": _sweep_manifest(sweep),
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
        self.done: dict[str, Entry] = read_ledger(self.records_path)
        """Case id -> verdict and attempt of its last record: the records stay in the journal
        (a driver's memory must not grow with it: :mod:`~attnbench.results.ledger`)."""
        if not self.new and self.manifest.get("sweep", {}).get("digest") != sweep.digest:
            self._extend()
        try:
            self._fh = io.TextIOWrapper(open_append(self.records_path), encoding="utf-8")
        except OSError as exc:
            raise RunDirError(f"{self.records_path}: cannot append: {refusal(exc)}") from None

    def _check_growth(self) -> None:
        """A run grows with its sweep (new axis values are new cases, and only they run), but
        what it has recorded must stay in the sweep: a run directory describes one sweep and
        holds no records of another. (Options must not change: :meth:`_check_options`.)"""
        old = self.manifest.get("sweep", {})
        if old.get("digest") == self.sweep.digest:
            return
        dropped = outside(self._journal(), self.sweep)  # streamed: only these are kept
        if dropped:
            example = printable(dropped[0].get("label") or dropped[0]["id"], 120)
            raise RunDirError(
                f"{self.manifest_path}: this run holds sweep {short_repr(old.get('name'))} "
                f"({old.get('cases')} cases); {len(dropped)} of its recorded cases are not in "
                f"{self.sweep.path} (e.g. {example}); a run may only grow (new axis values): "
                "restore them, or choose another --out to start a new run")

    def _extend(self) -> None:
        """The manifest now describes the grown sweep; ``extended`` keeps what it was."""
        old = self.manifest.get("sweep", {})
        added = sum(c.id not in self.done for c in self.sweep.cases)
        self.manifest.setdefault("extended", []).append(
            {"at": _now(), "from_digest": old.get("digest"), "from_cases": old.get("cases"),
             "to_digest": self.sweep.digest, "to_cases": len(self.sweep.cases)})
        self.manifest["sweep"] = {**old, **_sweep_manifest(self.sweep)}
        self._write_manifest()
        self.resume_note = (self.resume_note + "; " if self.resume_note else "") + (
            f"the sweep grew since this run began ({old.get('cases')} -> "
            f"{len(self.sweep.cases)} cases): the run is extended; {added} cases have no record")

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
            with open_update(self.records_path) as fh:
                size = fh.seek(0, os.SEEK_END)
                start = max(0, size - MAX_LINE_BYTES - 1)  # the last line, if it is one
                fh.seek(start)
                data = fh.read()
                if not data or data.endswith(b"\n"):
                    return
                newline = data.rfind(b"\n")
                if newline < 0 and start:
                    raise RunDirError(f"{self.records_path}: its last line is longer than "
                                      f"{MAX_LINE_BYTES} bytes; not a record attnbench wrote")
                cut = start + newline + 1
                try:
                    check_record("", parse_json(data[newline + 1:].decode("utf-8")))
                except (ValueError, RunDirError):
                    fh.truncate(cut)
                else:
                    fh.seek(0, os.SEEK_END)
                    fh.write(b"\n")
        except OSError as exc:
            raise RunDirError(f"{self.records_path}: cannot repair the journal's last line: "
                              f"{refusal(exc)}") from None

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

    def append(self, record: dict[str, Any], *, text: Optional[str] = None,
               flush: bool = True) -> Optional[str]:
        """Append one record (``text``: its compact JSON, if already made). ``flush``: handed
        to the kernel at once (a killed process loses nothing) and synced within
        :data:`SYNC_INTERVAL_S`; else it waits in the buffer for :meth:`flush` (the run loop's,
        once per batch: a flush per record cost the driver 0.45 ms at 800 records/s). Returns a
        note when the record comes from an environment (driver, CUDA, torch, clocks, commit,
        ...) the run has not seen before while earlier records of the same GPU kind came from
        another one."""
        if text is None:
            text = json.dumps(record, separators=(",", ":"), allow_nan=False)
        record, text = fit_line(record, text)  # what the journal reader's line cap admits
        with self._disk():
            self._fh.write(text + "\n")
        self._dirty = True
        if flush:
            self.flush()
        self.done[record["id"]] = Entry.of(record)
        with self._disk():  # a new environment rewrites the manifest: the same disk
            return self._note_env(record.get("env") or {})

    def flush(self) -> None:
        """Hand buffered records to the kernel (a killed process then loses none of them), and
        fsync when the last one is :data:`SYNC_INTERVAL_S` old. A record still in the buffer
        when the process is killed is a case pending again."""
        if self._fh is not None and self._dirty:
            with self._disk():
                self._fh.flush()
            if time.monotonic() - self._synced >= SYNC_INTERVAL_S:
                self.sync()

    def sync(self) -> None:
        """Force the journal to disk."""
        if self._fh is not None:
            with self._disk():
                self._fh.flush()
                os.fsync(self._fh.fileno())
            self._synced = time.monotonic()
            self._dirty = False

    @contextlib.contextmanager
    def _disk(self) -> Iterator[None]:
        """A write to the journal: an OSError (ENOSPC, EROFS, EIO) becomes one
        :class:`DiskError` naming the journal, and every later write raises it again, so
        nothing is appended after a record the disk cut short (a torn last line, which
        reopening the run drops: the journal stays valid)."""
        if self._broken is not None:
            raise self._broken
        try:
            yield
        except OSError as exc:
            self._broken = DiskError(
                f"{os_error_text(exc, str(self.records_path))}; the records written before "
                "stay, and rerunning the same command resumes once the disk can take more")
            raise self._broken from None

    def _note_env(self, env: dict) -> Optional[str]:
        host = env.get("host")
        device = {k: env.get(k) for k in ("host", "device", "gpu_kind", "device_name")}
        current = record_environment(env) if env.get("device") else None
        seen_key = (tuple(device.values()), current and tuple(current.values()))
        try:
            if seen_key in self._envs_noted:
                return None
        except TypeError:  # an unhashable value (check_record admits only scalars): scan
            seen_key = None
        note = self._note_new_env(env, host, device, current)
        if seen_key is not None:
            self._envs_noted.add(seen_key)
        return note

    def _note_new_env(self, env: dict, host, device: dict, current: Optional[dict]
                      ) -> Optional[str]:
        from attnbench.hardware import environment_differences

        note = None
        changed = False
        if env.get("device"):
            seen = self.manifest.setdefault("environments", [])
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
        try:  # atomic: a reader never sees half a manifest; a planted link is not followed
            write_atomic(self.manifest_path, json.dumps(self.manifest, indent=2))
        except OSError as exc:
            raise RunDirError(f"{self.manifest_path}: cannot write: {refusal(exc)}") from None

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
                if c.id not in self.done or self.done[c.id].verdict in self.retry]

    def attempt(self, case: Case) -> int:
        """The attempt number of the next record of ``case`` (1, or the last record's + 1)."""
        before = self.done.get(case.id)
        return 1 if before is None else before.attempt + 1

    def records(self) -> tuple[list[dict], int]:
        """The records of this sweep's cases, and how many other records the journal holds
        (pasted from another run; they are neither shown nor counted). Read back from the
        journal (what this run appended is handed to it first): the run keeps no record."""
        ids = {c.id for c in self.sweep.cases}
        mine, foreign = [], 0
        for record in self.last_records():
            if record["id"] in ids:
                mine.append(record)
            else:
                foreign += 1
        return mine, foreign

    def last_records(self) -> Iterator[dict]:
        """Each recorded case's last record, streamed, in :func:`load_records`' order (what
        this run appended is handed to the journal first): none is held, so the end of a run
        of 10^6 cases reads it back in bounded memory."""
        if self._fh is not None and self._broken is None:
            self.flush()
        if self.records_path.exists():
            yield from last_records(self.records_path)

    def _journal(self) -> Iterator[dict]:
        """The journal's records, streamed (none yet: nothing)."""
        if self.records_path.exists():
            yield from (record for _, record in journal_records(self.records_path))

    def close(self, discard_unused: bool = False, keep_lock: bool = False) -> None:
        """Close the journal and release the lock. ``discard_unused``: a run directory this run
        began and wrote no record into is removed again (a run that could not start leaves
        nothing behind: the directory if it made it, else the files it made). ``keep_lock``:
        the lock stays held (``submit``'s claim, handed to its driver).

        Never raises: it is the cleanup of runs that failed, also on a full or read-only disk
        (a close that raised there kept the driver's lock and its heartbeat alive until its
        worker was killed, issue 25). What the disk refused is lost; what it took stays."""
        try:
            if self._fh is not None:
                try:
                    self.sync()
                except DiskError:
                    pass  # already said where it happened
                finally:
                    fh, self._fh = self._fh, None
                    with contextlib.suppress(OSError):
                        fh.close()  # closes the file even when its last flush fails
            with contextlib.suppress(OSError):
                unused = (discard_unused and (self.created or self.new) and self._lock.held
                          and not (self.records_path.is_file()
                                   and self.records_path.stat().st_size))
                if unused and self.created:
                    shutil.rmtree(self.dir, ignore_errors=True)
                elif unused:
                    for path in (self.manifest_path, self.records_path, self._lock.path):
                        if path.is_file():
                            path.unlink()
        finally:
            if not keep_lock:
                self._lock.release()


def _sweep_manifest(sweep: Sweep) -> dict[str, Any]:
    return {"name": sweep.name, "path": sweep.path, "digest": sweep.digest,
            "cases": len(sweep.cases), "source": sweep.source, "description": sweep.description,
            "overrides": list(sweep.overrides)}


def _differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    out = []
    for key in dict.fromkeys([*old, *new]):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key} {a} -> {b}")
    return out


MAX_IDS_EXPANDED = 10_000
"""Cases of a sweep that ``status`` and ``show`` expand (from the manifest's copy of the sweep)
to tell its own records from others (~140 us a case: 1.4 s at most)."""


def sweep_case_ids(manifest: dict) -> Optional[frozenset[str]]:
    """The case ids of the sweep a manifest names (its source and ``-s`` overrides, as run),
    or None when they are not cheap or not certain (over :data:`MAX_IDS_EXPANDED` cases, a
    source that no longer parses, or other cases than the manifest counts: ``--case``)."""
    sweep = manifest.get("sweep") or {}
    source, cases, overrides = sweep.get("source"), sweep.get("cases"), sweep.get("overrides")
    if not (isinstance(source, str) and isinstance(cases, int)
            and 0 < cases <= MAX_IDS_EXPANDED):
        return None
    try:
        ids = frozenset(c.id for c in parse_sweep(source, str(sweep.get("path") or "sweep"),
                                                  overrides=list(overrides or ())).cases)
    except (UserError, ValueError, TypeError):  # a sweep attnbench no longer reads
        return None
    return ids if len(ids) == cases else None


def load_manifest(run_dir: Path | str) -> dict:
    path = Path(run_dir) / MANIFEST
    try:
        text = read_bounded(path, MAX_MANIFEST_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise RunDirError(f"{path}: no manifest; is {run_dir} a run directory made by "
                          "`attnbench run`?") from None
    except (OSError, ValueError) as exc:  # UnicodeDecodeError, a FIFO, over the cap
        raise RunDirError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        data = parse_json(text)
    except ValueError as exc:
        raise RunDirError(f"{path}: not valid JSON ({printable(exc, 200)})") from None
    return check_manifest(path, data)


def _stream_records(run_dir: Path | str) -> Iterator[dict]:
    """The records of a run directory's journal, streamed and checked (none if it has none)."""
    path = Path(run_dir) / RECORDS
    if path.exists():
        yield from (record for _, record in journal_records(path))


def load_records(run_dir: Path | str) -> list[dict]:
    """All records of a run, last one per case id winning; a torn last line is skipped. Every
    record is checked (:func:`check_record`); the first bad one is a :class:`RunDirError`
    naming its line and field. Read by :func:`~attnbench.results.journal.journal_records`
    (a line at a time, each capped); to stream a run without holding it, use that."""
    path = Path(run_dir) / RECORDS
    if not path.exists():
        if not (Path(run_dir) / MANIFEST).exists():
            raise RunDirError(f"{path}: not found; is {run_dir} a run directory made by "
                              "`attnbench run`?")
        return []
    by_id: dict[str, dict] = {}
    for _, record in journal_records(path):  # streamed, each line capped
        by_id[record["id"]] = record
    return list(by_id.values())


def stream_records(run_dir: Path | str) -> Iterator[dict]:
    """:func:`load_records`, streamed: the same records in the same order, each read, checked
    and let go (:func:`~attnbench.results.ledger.last_records`), so a reader's memory does not
    grow with the journal. A run directory without a journal refuses as ``load_records``
    does, when iteration begins."""
    path = Path(run_dir) / RECORDS
    if not path.exists():
        if not (Path(run_dir) / MANIFEST).exists():
            raise RunDirError(f"{path}: not found; is {run_dir} a run directory made by "
                              "`attnbench run`?")
        return
    yield from last_records(path)


def stream_record_blocks(run_dir: Path | str) -> Iterator:
    """:func:`stream_records`, but blocks of clean lines as Arrow columns where pyarrow is
    installed (:func:`~attnbench.results.columnar.last_record_blocks`: records and
    ``RecordBlock`` s, the same records in the same order)."""
    from attnbench.results.columnar import last_record_blocks

    path = Path(run_dir) / RECORDS
    if not path.exists():
        yield from stream_records(run_dir)  # its refusal, or nothing
        return
    yield from last_record_blocks(path)


def records_frame(records: Iterable[dict]):
    """Records as a flat pandas DataFrame (columns like ``case.seqlen_q``,
    ``timing.fwd.tflops``)."""
    import pandas as pd

    return pd.json_normalize(list(records))
