"""The client side of a run: submit pending cases, stream records into the journal.

At most ``2 x slots`` cases are in flight, so a large sweep does not flood the scheduler and an
interruption loses only those. Records are appended the moment they arrive (as_completed).
"""

from __future__ import annotations

import collections
import sys
import time
from dataclasses import dataclass, field
from typing import Optional, TextIO

from attnbench.cluster import Connection, run_case_task
from attnbench.records import BAD_VERDICTS, make_record
from attnbench.store import RunStore


@dataclass
class RunSummary:
    submitted: int = 0
    counts: collections.Counter = field(default_factory=collections.Counter)
    wall_s: float = 0.0
    inside_s: float = 0.0
    """Sum of time spent inside rank processes on cases (accuracy + timing)."""
    interrupted: bool = False


class Progress:
    """One status line (rewritten on a terminal, printed every few seconds otherwise); failing
    cases get a line of their own as they arrive."""

    def __init__(self, total: int, already: int, stream: TextIO = sys.stderr):
        self.total, self.already, self.stream = total, already, stream
        self.done = 0
        self.counts: collections.Counter = collections.Counter()
        self.start = time.perf_counter()
        self.tty = stream.isatty()
        self.last_print = 0.0

    def update(self, record: dict) -> None:
        self.done += 1
        self.counts[record["verdict"]] += 1
        if record["verdict"] in BAD_VERDICTS:
            self._clear()
            print(f"  {record['verdict'].upper():8s} {record['id'][:10]} {record['label']}: "
                  f"{record['reason']}", file=self.stream)
        now = time.perf_counter()
        if self.tty or now - self.last_print > 5 or self.done == self.total:
            self.last_print = now
            self._line()

    def _clear(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K")

    def _line(self) -> None:
        elapsed = time.perf_counter() - self.start
        rate = self.done / elapsed if elapsed > 0 else 0
        eta = (self.total - self.done) / rate if rate else 0
        parts = " ".join(f"{v} {n}" for v, n in sorted(self.counts.items()))
        text = (f"[{self.done + self.already}/{self.total + self.already}] {parts}  "
                f"{elapsed:.0f}s elapsed, ETA {eta:.0f}s")
        if self.tty:
            self.stream.write("\r\033[K" + text)
            if self.done == self.total:
                self.stream.write("\n")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def run_pending(store: RunStore, conn: Connection, stream: TextIO = sys.stderr) -> RunSummary:
    from distributed import as_completed

    cases = store.pending()
    summary = RunSummary(submitted=len(cases))
    progress = Progress(len(cases), len(store.done), stream)
    options = store.sweep.options.to_dict()
    limit = max(2, 2 * conn.slots)
    queue = list(reversed(cases))
    by_key: dict[str, object] = {}
    t0 = time.perf_counter()

    def submit_next(ac) -> None:
        case = queue.pop()
        fut = conn.client.submit(run_case_task, case.to_dict(), options, 1,
                                 key=f"case-{case.id}-{time.monotonic_ns()}", pure=False)
        by_key[fut.key] = case
        ac.add(fut)

    ac = as_completed()
    try:
        for _ in range(min(limit, len(queue))):
            submit_next(ac)
        for fut in ac:
            case = by_key.pop(fut.key)
            try:
                record = fut.result()
            except Exception as exc:  # the task itself failed: worker lost, harness bug, ...
                record = make_record(case, verdict="lost",
                                     reason=f"{type(exc).__name__}: {str(exc)[:300]}")
            store.append(record)
            summary.counts[record["verdict"]] += 1
            summary.inside_s += record.get("duration_s") or 0.0
            progress.update(record)
            if queue:
                submit_next(ac)
    except KeyboardInterrupt:
        summary.interrupted = True
        for fut in list(ac.futures):
            fut.cancel()
    summary.wall_s = time.perf_counter() - t0
    return summary
