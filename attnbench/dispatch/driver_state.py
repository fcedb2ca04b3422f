"""What a detached run leaves in its run directory for ``status``, ``attach`` and ``cancel``.

Beside ``manifest.json`` and ``records.jsonl`` (the truth), a run driven on the cluster
(``attnbench submit``) keeps three small files, all written by the one lock holder:

``driver.json``   the driver's state, rewritten atomically once a second: ``state`` (one of
                  :data:`STATES`), where it runs (host, pid, worker, scheduler), progress
                  (done, total, verdict counts, rate, ETA) and which worker runs which case.
``driver.log``    the progress lines ``attnbench run`` would print, appended.
``.cancel``       written by ``attnbench cancel``: the lock token or submission id to stop.

Nothing here is needed to resume: a run directory without them is an ordinary run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Iterable, Optional

from attnbench.results.files import write_atomic

STATE = "driver.json"
LOG = "driver.log"
CANCEL = ".cancel"
STATES = ("submitted", "starting", "running", "finished", "cancelled", "failed")
FINAL = ("finished", "cancelled", "failed")


def write_state(run_dir: Path, state: dict[str, Any]) -> None:
    """Replace ``driver.json`` atomically (a reader never sees half of it)."""
    write_atomic(Path(run_dir) / STATE,  # a random temporary name: no planted link followed
                 json.dumps({**state, "updated": time.time()}, separators=(",", ":")))


def read_state(run_dir: Path) -> Optional[dict[str, Any]]:
    """The driver's last state, or None when there is none (or it cannot be read)."""
    try:
        data = json.loads((Path(run_dir) / STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def request_cancel(run_dir: Path, tokens: Iterable[str]) -> None:
    write_atomic(Path(run_dir) / CANCEL, json.dumps({"stop": [t for t in tokens if t],
                                                     "at": time.time()}))


def cancel_requested(run_dir: Path, tokens: Iterable[str]) -> bool:
    """True when ``attnbench cancel`` asked to stop the holder of any of ``tokens``."""
    try:
        data = json.loads((Path(run_dir) / CANCEL).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    stop = data.get("stop") if isinstance(data, dict) else None
    return isinstance(stop, list) and any(t in stop for t in tokens if t)
