"""The runs of a history: run directories named, or found one level inside a folder of runs.

``attnbench history RUN...`` takes run directories (each with ``records.jsonl``) or folders
that hold them (``results/``): a folder without a journal is searched one level deep, without
following links (a link in a shared results folder may point anywhere), and at most
:data:`MAX_RUNS` runs are read. Each run is read as ``attnbench compare`` reads it
(:func:`~attnbench.report.compare.comparison.load_compared`: the compared columns, the
environments, each backend's code), so a hostile run is refused the same way: one line, exit 2.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from attnbench.errors import ReportError
from attnbench.report.compare.comparison import load_compared
from attnbench.report.read.data import Run, journal_of
from attnbench.report.read.environment import representative

MAX_RUNS = 1_000
"""Runs one history reads: each is read whole (a few seconds for 10^5 records), so a folder of
more is refused in one line rather than read for an hour."""


@dataclass
class HistoryRun:
    """One run of a history and the facts that place it."""

    run: Run
    commit: str | None
    """The project's commit the records name (their environment's, else the manifest's)."""
    commit_date: datetime | None
    """That commit's committer date (``software.commit_date``; runs before it: None)."""
    created: datetime | None
    """When the run began (``manifest.created``)."""
    dirty: bool | None = None

    @property
    def run_id(self) -> str:
        return self.run.run_id


def run_dirs(paths: Sequence[Path]) -> list[Path]:
    """The run directories ``paths`` name: each one with a journal, or the folders one level
    inside it that have one (sorted by name). :class:`ReportError` when a path is neither, a
    run is named twice, or more than :data:`MAX_RUNS` are found."""
    found: list[Path] = []
    for path in map(Path, paths):
        if _is_run(path):
            found.append(path)
            continue
        if not path.is_dir():
            raise ReportError(f"{path}: no such run directory (RUN is a run directory or a "
                              "folder of them)")
        inside = _runs_inside(path)
        if not inside:
            raise ReportError(f"{path}: no records.jsonl, and no run directory inside it; RUN "
                              "must be a run directory written by `attnbench run` or a folder "
                              "of them")
        found += inside
        if len(found) > MAX_RUNS:
            break
    if len(found) > MAX_RUNS:
        raise ReportError(f"RUN: more than {MAX_RUNS} runs; name fewer (a history reads every "
                          "run whole)")
    seen: set[Path] = set()
    for path in found:
        real = path.resolve()
        if real in seen:
            raise ReportError(f"RUN: {path} is given twice")
        seen.add(real)
    return found


def _is_run(path: Path) -> bool:
    try:
        journal_of(path)
    except ReportError:
        return False
    return True


def _runs_inside(folder: Path) -> list[Path]:
    """Directories right inside ``folder`` with a journal; links are not followed."""
    try:
        with os.scandir(folder) as entries:
            names = sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
    except OSError as exc:
        raise ReportError(f"{folder}: cannot list: {exc.strerror or exc}") from None
    out = []
    for name in names:
        child = folder / name
        try:
            mode = os.lstat(journal_of(child, directory=False)).st_mode
        except (OSError, ReportError):  # no journal (or it went away)
            continue
        if stat.S_ISREG(mode):
            out.append(child)
        if len(out) > MAX_RUNS:
            break
    return out


def parse_time(value: Any) -> datetime | None:
    """An ISO 8601 time as an aware datetime (no zone: UTC); None for anything else."""
    if not isinstance(value, str) or not value or len(value) > 64:
        return None
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def history_run(run: Run) -> HistoryRun:
    """A loaded run with the facts that order it: the commit, its date, the run's start. The
    records' own environment (the code that produced the numbers) before the manifest's (the
    client's)."""
    view = representative(run.environments)
    versions = run.manifest.get("versions")
    versions = versions if isinstance(versions, dict) else {}
    commit = view.get("commit") or versions.get("commit")
    if view.get("commit"):
        date, dirty = view.get("commit_date"), view.get("dirty")
    else:
        date, dirty = versions.get("commit_date"), versions.get("dirty")
    return HistoryRun(run=run, commit=str(commit) if commit else None,
                      commit_date=parse_time(date), created=parse_time(run.manifest.get("created")),
                      dirty=dirty if isinstance(dirty, bool) else None)


def load_history(paths: Sequence[Path], jobs: int = 1) -> list[HistoryRun]:
    """Every run ``paths`` name (:func:`run_dirs`), read; runs that share a run id are told
    apart by their path."""
    runs = [load_compared(path, jobs) for path in run_dirs(paths)]
    ids = [r.run_id for r in runs]
    for run in runs:
        if ids.count(run.run_id) > 1:
            run.manifest = {**run.manifest, "run_id": f"{run.run_id} ({run.path})"}
    return [history_run(run) for run in runs]

