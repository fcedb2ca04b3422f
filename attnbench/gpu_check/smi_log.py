"""The clock and power log of the whole check: ``nvidia-smi --query-gpu=... -lms 500`` in the
background, into ``smi.csv``, and what it says (clocks held or not, power, temperature,
throttle reasons).

A number is only worth the clocks it ran at: a GPU that throttles (power, thermal) mid-sweep
shows here, beside the figures, at the time it happened. Absent on a CPU box (no nvidia-smi):
the summary says so, and no file is written.
"""

from __future__ import annotations

import contextlib
import csv
import os
import shutil
import signal
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

from attnbench.gpu_check.folder import SMI
from attnbench.hardware.clock_watch import NOT_THROTTLING

INTERVAL_MS = 500
"""Issue #24's period: 8 minutes are ~1000 lines, a few hundred kB."""
FIELDS = ("timestamp", "index", "clocks.sm", "clocks.mem", "clocks.max.sm", "power.draw",
          "power.limit", "temperature.gpu", "utilization.gpu", "memory.used",
          "clocks_event_reasons.active")
"""``clocks_event_reasons`` is the throttle-reason bitmask's name since driver 535 (before:
``clocks_throttle_reasons``); a driver that knows neither gets the list without it."""
START_CHECK_S = 1.0
"""An unknown field makes nvidia-smi exit at once: alive after this long, it is logging."""


class SmiLog:
    """``start()`` the logger, ``stop()`` it and read back what it logged."""

    def __init__(self, folder: Path, executable: str = "nvidia-smi",
                 interval_ms: int = INTERVAL_MS):
        self.path = Path(folder) / SMI
        self.executable = executable
        self.interval_ms = interval_ms
        self.proc: Optional[subprocess.Popen] = None
        self.note = ""

    def start(self) -> str:
        """Start logging; the reason when there is no log (no nvidia-smi, it refused)."""
        exe = shutil.which(self.executable)
        if exe is None:
            self.note = f"{self.executable} not found: no clock/power log (a CPU box)"
            return self.note
        for fields in (FIELDS, FIELDS[:-1]):
            with open(self.path, "wb") as out:
                self.proc = subprocess.Popen(
                    [exe, f"--query-gpu={','.join(fields)}", "--format=csv,nounits",
                     "-lms", str(self.interval_ms)],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True)
            time.sleep(START_CHECK_S)
            if self.proc.poll() is None:
                return ""
            said = self.path.read_text(errors="replace").strip().splitlines()
            self.note = (f"{self.executable} exited with status {self.proc.returncode}: "
                         f"{said[-1][:200] if said else ''}")
        self.proc = None
        with contextlib.suppress(OSError):
            self.path.unlink()
        return self.note

    def stop(self) -> dict[str, Any]:
        """Stop logging; what the log says (:func:`summarize`)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            self.proc = None
        if not self.path.exists():
            return {"file": None, "note": self.note or "no log"}
        return {"file": SMI, **summarize(self.path)}


def _number(text: str) -> Optional[float]:
    try:
        return float(text.strip())
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def summarize(path: Path) -> dict[str, Any]:
    """Samples, and min / median / max of the SM clock, power and temperature; how many
    samples had a throttle reason (:data:`NOT_THROTTLING` aside)."""
    with open(path, newline="", errors="replace") as fh:
        rows = list(csv.reader(fh, skipinitialspace=True))
    if not rows:
        return {"samples": 0}
    header = [h.split(" [")[0].strip() for h in rows[0]]
    body = [dict(zip(header, r)) for r in rows[1:] if len(r) == len(header)]
    out: dict[str, Any] = {"samples": len(body)}
    for key, name in (("clocks.current.sm", "sm_clock_mhz"), ("clocks.sm", "sm_clock_mhz"),
                      ("power.draw", "power_w"), ("temperature.gpu", "temperature_c")):
        values = [v for v in (_number(row.get(key, "")) for row in body) if v is not None]
        if values:
            out[name] = {"min": min(values), "median": statistics.median(values),
                         "max": max(values)}
    reasons = [_bits(row.get("clocks_event_reasons.active")
                     or row.get("clocks_throttle_reasons.active")) for row in body]
    if any(r is not None for r in reasons):
        out["throttled_samples"] = sum(1 for r in reasons if r and r & ~NOT_THROTTLING)
    return out


def _bits(text: Optional[str]) -> Optional[int]:
    try:
        return int(text.strip(), 16) if text else None
    except ValueError:
        return None
