"""What a detached run leaves in its run directory for ``status``, ``attach`` and ``cancel``.

Beside ``manifest.json`` and ``records.jsonl`` (the truth), a run driven on the cluster
(``attnbench submit``) keeps three small files, all written by the one lock holder:

``driver.json``   the driver's state, rewritten atomically once a second: ``state`` (one of
                  :data:`STATES`), where it runs (host, pid, worker, scheduler), progress
                  (done, total, verdict counts, rate, ETA) and which worker runs which case.
``driver.log``    the progress lines ``attnbench run`` would print, appended.
``.cancel``       written by ``attnbench cancel``: the lock tokens and submission ids to stop
                  (kept from earlier cancels: a driver still queued for one stops too).

Nothing here is needed to resume: a run directory without them is an ordinary run. Run
directories are shared, so ``status`` reads ``driver.json`` as it reads manifests: checked field
by field (:func:`load_state`), a bad value is one line naming the file and the field.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from attnbench.errors import RunDirError, short_repr
from attnbench.results.files import write_atomic
from attnbench.validation import parse_json, read_bounded

STATE = "driver.json"
LOG = "driver.log"
CANCEL = ".cancel"
STATES = ("submitted", "starting", "running", "finished", "cancelled", "failed")
FINAL = ("finished", "cancelled", "failed")
STATE_LIMIT = 8 << 20
"""Bytes of ``driver.json`` read at most: ``running`` lists at most 8 cases per worker (~100
bytes each), so 10,000 workers fit; a planted giant file is refused, not read."""
CANCEL_LIMIT = 1 << 20
"""Bytes of ``.cancel`` read at most: 64 tokens of ~40 characters are ~3 KB."""
CANCEL_KEEP = 64
"""Tokens ``.cancel`` keeps (the newest): every driver still queued or waiting for a run
directory is one of a few submissions."""


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _text_lists(v: Any) -> bool:
    return isinstance(v, dict) and all(
        isinstance(k, str) and isinstance(c, list) and all(isinstance(x, str) for x in c)
        for k, c in v.items())


_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    **{k: (lambda v: isinstance(v, str), "a string") for k in (
        "submission", "host", "worker", "worker_address", "scheduler", "sweep", "run_dir",
        "message")},
    **{k: (_number, "a number") for k in (
        "pid", "started", "updated", "total", "already", "done", "rate", "eta_s", "in_flight",
        "queued", "workers", "devices", "written", "not_run")},
    "state": (lambda v: v in STATES, f"one of {', '.join(STATES)}"),
    "counts": (lambda v: isinstance(v, dict) and all(map(_number, v.values())),
               "an object of verdict counts"),
    "running": (_text_lists, "an object of worker -> list of case lines"),
    "scheduler_lost": (lambda v: isinstance(v, bool), "true or false"),
}
"""What each field of ``driver.json`` holds (null is always allowed: not known)."""


def check_state(path: Path, data: Any) -> dict[str, Any]:
    """``driver.json``'s content checked by kind, as far as anything reads it."""
    if not isinstance(data, dict):
        raise RunDirError(f"{path}: got {short_repr(data)}, expected a JSON object (the "
                          "driver's state)")
    for key, (ok, expected) in _FIELDS.items():
        value = data.get(key)
        if value is not None and not ok(value):
            raise RunDirError(f"{path}: {key}: got {short_repr(value)}, expected {expected}")
    return data


def load_state(run_dir: Path) -> Optional[dict[str, Any]]:
    """The driver's last state, checked (:func:`check_state`); None when there is none. What
    cannot be read or is malformed is a :class:`RunDirError`, one line."""
    path = Path(run_dir) / STATE
    try:  # bounded, and never waiting on a FIFO planted there
        data = read_bounded(path, STATE_LIMIT)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RunDirError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise RunDirError(f"{path}: {exc}; not a driver's state") from None
    try:
        parsed = parse_json(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise RunDirError(f"{path}: not valid JSON ({short_repr(str(exc))})") from None
    return check_state(path, parsed)


def write_state(run_dir: Path, state: dict[str, Any]) -> None:
    """Replace ``driver.json`` atomically (a reader never sees half of it)."""
    write_atomic(Path(run_dir) / STATE,  # a random temporary name: no planted link followed
                 json.dumps({**state, "updated": time.time()}, separators=(",", ":")))


def read_state(run_dir: Path) -> Optional[dict[str, Any]]:
    """The driver's last state, or None when there is none (or it cannot be read, or is
    malformed): for the commands that only poll it."""
    try:
        return load_state(run_dir)
    except RunDirError:
        return None


def _cancelled_tokens(run_dir: Path) -> list[str]:
    try:  # a FIFO planted at .cancel must not wedge the driver's tick or `attnbench cancel`
        data = json.loads(read_bounded(Path(run_dir) / CANCEL, CANCEL_LIMIT))
    except (OSError, ValueError, RecursionError):
        return []  # unreadable: no request (a cancel replaces the file whatever it is)
    stop = data.get("stop") if isinstance(data, dict) else None
    return [t for t in stop if isinstance(t, str)] if isinstance(stop, list) else []


def request_cancel(run_dir: Path, tokens: Iterable[str]) -> None:
    """Ask the holders of ``tokens`` to stop, and every driver still waiting for them (the
    tokens of earlier cancels are kept: a driver queued for one of them must not start)."""
    tokens = [t for t in tokens if t]
    keep = [t for t in _cancelled_tokens(run_dir) if t not in tokens]
    stop = (keep + tokens)[-CANCEL_KEEP:]
    write_atomic(Path(run_dir) / CANCEL, json.dumps({"stop": stop, "at": time.time()}))


def cancel_requested(run_dir: Path, tokens: Iterable[str]) -> bool:
    """True when ``attnbench cancel`` asked to stop the holder of any of ``tokens``."""
    stop = _cancelled_tokens(run_dir)
    return any(t in stop for t in tokens if t)
