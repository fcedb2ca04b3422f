"""A call's deadline that stands still while a backend compiles.

A rank tells its pool when a backend's compile starts and ends
(:func:`attnbench.backends.base.compiling`, sent by :mod:`attnbench.execution.child`); the pool's
wait for the call (:meth:`attnbench.execution.pool.RankPool.run`) reads its remaining time here,
so compile seconds do not count against the case's ``timeout_s`` -- up to a compile's own limit.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

COMPILE_GRACE_S = 900.0
"""How long a backend's compile (:func:`attnbench.backends.base.compiling`) may run with its
case's timeout stopped: a cold FlexAttention compile took 87.5 s on a user's box (issue 27) and
71 s here on 2 busy cores; ten times the former, so a compile that hangs still ends."""


class CallClock:
    """A call's deadline, stopped while any rank compiles (up to :data:`COMPILE_GRACE_S`)."""

    def __init__(self, deadline: float,
                 on_change: Optional[Callable[[bool], None]] = None):
        self.deadline = deadline
        self.compiling: set[int] = set()
        self.since = 0.0
        self.compiled_s = 0.0
        self.on_change = on_change
        """Told True when the first rank starts compiling, False when the last one ends (the
        worker passes it on to the client's progress line)."""

    def note(self, rank: int, start: bool) -> None:
        now = time.monotonic()
        if start:
            if not self.compiling:
                self.since = now
                self._tell(True)
            self.compiling.add(rank)
        elif rank in self.compiling:
            self.compiling.discard(rank)
            if not self.compiling:
                self.deadline += now - self.since
                self.compiled_s += now - self.since
                self._tell(False)

    def _tell(self, compiling: bool) -> None:
        if self.on_change is not None:
            try:
                self.on_change(compiling)
            except Exception:  # noqa: BLE001 -- news for a progress line never stops a case
                pass

    @staticmethod
    def grace_s() -> float:
        return COMPILE_GRACE_S  # read at each call: a test may lower it

    def remaining(self) -> float:
        if self.compiling:
            return self.since + self.grace_s() - time.monotonic()
        return self.deadline - time.monotonic()
