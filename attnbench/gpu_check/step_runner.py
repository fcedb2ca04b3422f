"""One step of the check in its own process, under its own timeout (the driver's side).

A step runs as ``python -c <boot> NAME FUNC CONFIG`` in a new session, so a step that hangs
(a kernel that never returns, NVML stuck, a compile that never ends) is killed with everything
it started -- its process group, SIGTERM then SIGKILL -- and the check goes on to the next step
and always to the collection. Its output is echoed line by line and its tail kept for the
summary. The driver never imports torch: only the step processes do.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

STATUSES = ("ok", "failed", "timeout", "skipped", "interrupted")
TAIL_LINES = 30
"""Lines of a step's output kept in the summary."""
TERM_GRACE_S = 3.0
"""Between SIGTERM and SIGKILL of a step's process group: a rank pool stops its ranks."""
MIN_STEP_S = 5.0
"""A step given less than this by the budget is skipped: it could not even start torch."""

_ROOT = str(Path(__file__).resolve().parents[2])
_BOOT = ("import sys; sys.path.insert(0, {root!r}); "
         "from attnbench.gpu_check.step_main import main; sys.exit(main(sys.argv[1:]))")


@dataclass
class StepResult:
    """What one step came to, as the summary keeps it."""

    name: str
    status: str
    seconds: float = 0.0
    estimate_s: float = 0.0
    timeout_s: float = 0.0
    returncode: Optional[int] = None
    note: str = ""
    output_tail: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def run_step(name: str, func: str, config: dict, *, timeout_s: float, estimate_s: float,
             echo: Callable[[str], None] = print, env: Optional[dict] = None) -> StepResult:
    """Run step ``name`` (``func``, "module:function", called with ``config``) in a process of
    its own; kill its process group after ``timeout_s``."""
    result = StepResult(name, "skipped", estimate_s=estimate_s, timeout_s=round(timeout_s, 1))
    if timeout_s < MIN_STEP_S:
        result.note = f"skipped: {timeout_s:.0f} s left in the check's budget"
        return result
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", _BOOT.format(root=_ROOT), name, func,
         json.dumps({**config, "timeout_s": timeout_s})],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True, env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"})
    reader = threading.Thread(target=_pump, args=(proc, name, tail, echo), daemon=True)
    reader.start()
    try:
        result.returncode = proc.wait(timeout=timeout_s)
        result.status = "ok" if result.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        result.status = "timeout"
        result.note = f"no end after {timeout_s:.0f} s; its process group was killed"
    except KeyboardInterrupt:
        _kill_group(proc)
        result.status = "interrupted"
        result.note = "interrupted (Ctrl-C); its process group was killed"
    reader.join(timeout=5.0)  # a grandchild outside the group may hold the pipe: do not hang
    result.seconds = round(time.perf_counter() - started, 1)
    result.output_tail = "\n".join(tail)
    if result.status == "failed" and not result.note:
        result.note = f"exit status {result.returncode}: " + (tail[-1] if tail else "")
    return result


def _pump(proc: subprocess.Popen, name: str, tail: collections.deque,
          echo: Callable[[str], None]) -> None:
    quiet = False
    for raw in proc.stdout:  # drained to the end, or the step would block on a full pipe
        line = raw.decode("utf-8", errors="replace").rstrip()
        tail.append(line)
        if not quiet:
            try:
                echo(f"  [{name}] {line}")
            except OSError:  # our reader left (`| head`): the step goes on, unechoed
                quiet = True
    proc.stdout.close()


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the step's process group, SIGKILL what is left after :data:`TERM_GRACE_S`."""
    for sig, wait in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            if sig == signal.SIGTERM:  # the leader is gone; its group may not be
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            return
        except subprocess.TimeoutExpired:
            continue
