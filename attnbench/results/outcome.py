"""Whether a run ran anything (issue 40, item 1).

A run in which every case was refused -- ``skipped`` (no connected worker can run it: a plain
``dask worker`` without attnbench resources, a GPU kind missing) or ``unsupported`` (its backend
cannot do the case here) -- measured nothing, and a CI job must not go green on it. ``run``,
``submit``, ``status`` and ``attach`` ask :func:`nothing_ran` with the verdict counts of each
case's last record and say the one line it returns on standard output.

The exit status says whose the reason is:

* any case ``skipped`` -> 3 (:data:`~attnbench.errors.EXIT_CLUSTER`): the cluster lacks what
  the cases need; skipped cases always run again, so the same command resumes once the right
  workers are connected (what 3 promises);
* every case ``unsupported`` -> 1 (:data:`~attnbench.errors.EXIT_FAILURES`): nothing is wrong
  with the cluster and a rerun changes nothing; the sweep asks its backend for what it cannot
  do on this hardware, a failed run.

A sweep where some cases ran and others were refused (PyTorch's CPU flash backward is
``unsupported`` beside cases that pass) is judged by what ran, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from attnbench.errors import EXIT_CLUSTER, EXIT_FAILURES, printable
from attnbench.results.records import NOT_RUN_VERDICTS

REASON_CHARS = 300
"""Characters of a record's reason the line quotes (a reason is one line of at most 400)."""


@dataclass(frozen=True, slots=True)
class NothingRan:
    """A run that ran no case: its exit status and the one line that says why."""

    exit_status: int
    line: str


def ran_count(counts: Mapping[str, int]) -> int:
    """Cases whose last record is not a refusal: they started on a worker (a crash too)."""
    return sum(n for v, n in counts.items() if v not in NOT_RUN_VERDICTS)


def nothing_ran(counts: Mapping[str, int],
                reasons: Optional[Mapping[str, str]] = None) -> Optional[NothingRan]:
    """None when some case ran; else why none did. ``counts``: verdict -> cases (each case's
    last record); ``reasons``: a reason seen for ``skipped`` / ``unsupported`` (quoted)."""
    if ran_count(counts):
        return None
    reasons = reasons or {}
    skipped, unsupported = counts.get("skipped", 0), counts.get("unsupported", 0)
    if not skipped and not unsupported:
        return NothingRan(EXIT_CLUSTER, "attnbench: nothing ran: no case was recorded")

    def why(verdict: str) -> str:
        reason = reasons.get(verdict)
        return f" ({printable(reason, REASON_CHARS)})" if reason else ""

    parts = []
    every = "all " if not (skipped and unsupported) and skipped + unsupported > 1 else ""
    if skipped:
        parts.append(f"{every}{skipped} case{'s' if skipped != 1 else ''} skipped, no connected "
                     f"worker can run {'them' if skipped != 1 else 'it'}{why('skipped')}")
    if unsupported:
        noun = "" if skipped else f" case{'s' if unsupported != 1 else ''}"
        parts.append(f"{every}{unsupported}{noun} unsupported by "
                     f"{'their' if unsupported != 1 else 'its'} backend{why('unsupported')}")
    return NothingRan(EXIT_CLUSTER if skipped else EXIT_FAILURES,
                      "attnbench: nothing ran: " + "; ".join(parts))
