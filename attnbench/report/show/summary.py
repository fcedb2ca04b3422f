"""What ``attnbench show`` and the end of ``attnbench run`` say about a run, from one pass over
its records: verdict counts per backend, the first failing cases, what the failures share, the
accuracy findings and the exit status.

A run of 10^6 cases is read once and held by nobody (issue 29): :class:`RunSummary` keeps
counts, the :data:`LISTED` failing cases that come first by (verdict, label) -- less those the
run already printed as they came (``shown``) --, the tallies of
:mod:`~attnbench.report.read.commonality`, the series that fail, and per series and length the
error means of :mod:`~attnbench.report.read.trends` -- never a record. Feed it records
(:meth:`RunSummary.add`, or :meth:`RunSummary.of` an iterable): a list and a stream give the
same text.
"""

from __future__ import annotations

import collections
from typing import Iterable

from attnbench.errors import EXIT_FAILURES, EXIT_FINDINGS, EXIT_OK, printable
from attnbench.report.read.commonality import Commonality, failed_tensors
from attnbench.report.read.trends import SeriesCollector, fitted, series_key
from attnbench.results.records import BAD_VERDICTS, VERDICTS

LISTED = 10
"""Failing cases listed by name, besides those the run printed as they came (the rest are
counted: ``show --all`` lists every case). A broken kernel fails tens of cases: what they share
(:meth:`RunSummary.common_text`) says more than a longer list."""
FINDINGS_LISTED = 20
"""Findings described one per line (all are counted)."""
_PRUNE_AT = 20 * LISTED
"""Failing cases held before keeping only the first :data:`LISTED` again: a sort of 1,000 slim
tuples now and then instead of a heap push per case; memory stays a few hundred KB."""


class RunSummary:
    """A run's records, summarised as they come (see the module docstring)."""

    def __init__(self, shown: Iterable[str] = ()) -> None:
        self.shown = frozenset(shown)
        """Ids of the failing cases already printed (the run's first few, as they came): not
        listed again (:data:`attnbench.dispatch.loop.SHOWN_LIVE` of them at most)."""
        self.count = 0
        """Records added (one per case)."""
        self.bad = 0
        """Of them, those whose verdict is bad (:data:`BAD_VERDICTS`)."""
        self.bad_shown = 0
        """Of those, the ones in ``shown``."""
        self.common = Commonality()
        self._failing_series: set[tuple] = set()
        """(series key, tensor) of each tensor that failed a check in some case: a finding on
        such a series says nothing the failure has not (:meth:`findings_text`)."""
        self.table: dict[str, collections.Counter] = collections.defaultdict(
            collections.Counter)
        self._failing: list[tuple[str, str, int, str]] = []
        """(verdict, label, order, line): the smallest first, as a stable sort would list them."""
        self._series = SeriesCollector()

    @classmethod
    def of(cls, records: Iterable[dict]) -> "RunSummary":
        summary = cls()
        for record in records:
            summary.add(record)
        return summary

    def add(self, r: dict) -> None:
        self.table[r["case"]["backend"]][r["verdict"]] += 1
        if r["verdict"] in BAD_VERDICTS:
            self.bad += 1
            if r.get("id") in self.shown:
                self.bad_shown += 1
            else:
                self._failing.append((r["verdict"], r.get("label", ""), self.count, printable(
                    f"  {r['verdict']:<8} {str(r.get('id', ''))[:10]}  {r.get('label', '')}: "
                    f"{r.get('reason', '')}", 2000)))
            if len(self._failing) >= _PRUNE_AT:
                self._failing = sorted(self._failing)[:LISTED]
            if r["verdict"] == "fail" and isinstance(r.get("case"), dict):
                key = series_key(r["case"])
                self._failing_series.update((key, t) for t in failed_tensors(r))
        self.common.add(r)
        self._series.add(r)
        self.count += 1

    def table_text(self) -> str:
        """Verdict counts per backend, then the failing cases."""
        table = self.table
        present = [v for v in VERDICTS if any(c[v] for c in table.values())]
        width = max([len("backend")] + [len(b) for b in table])
        lines = [f"{'backend':<{width}}  " + "  ".join(f"{v:>11}" for v in present)]
        for backend in sorted(table):
            lines.append(f"{printable(backend):<{width}}  "
                         + "  ".join(f"{table[backend][v]:>11}" for v in present))
        if self.bad:
            above = f" ({self.bad_shown} of them printed above as they came)" \
                if self.bad_shown else ""
            listed = sorted(self._failing)[:LISTED]
            lines.append(f"{self.bad} failing cases{above}" + (":" if listed else ""))
            lines += [line for *_, line in listed]
            more = self.bad - self.bad_shown - len(listed)
            if more > 0:
                lines.append(f"  ... {more} more (attnbench show RUN --all)")
        return "\n".join(lines)

    def common_text(self) -> list[str]:
        """What the failing cases of each backend share (:mod:`~attnbench.report.read.
        commonality`), a heading and a line per backend; [] when there is nothing to say."""
        return self.common.lines()

    def findings_text(self) -> list[str]:
        """The accuracy findings across the sweep (:mod:`attnbench.report.read.trends`), one line
        each."""
        found = [t for t in fitted(self._series.series()) if t.finding]
        failing = [t for t in found if (t.series.key, t.series.tensor) in self._failing_series]
        found = [t for t in found if (t.series.key, t.series.tensor) not in self._failing_series]
        # A failing series' finding repeats its failure (a broken dK is also over 2x a fused
        # kernel's error): counted, not described.
        skipped = [f"({len(failing)} finding{'s' if len(failing) != 1 else ''} on series "
                   "that already fail not repeated)"] if failing else []
        if not found:
            return skipped
        return [f"{len(found)} accuracy finding{'s' if len(found) != 1 else ''} (error "
                "growing with the sequence faster than the fused baseline's, or a declared "
                "input-precision tensor over 2x it; every case may still pass; "
                "docs/findings.md):",
                *(f"  FINDING {trend.describe()}" for trend in found[:FINDINGS_LISTED]),
                *skipped]

    def exit_status(self, findings: list[str]) -> int:
        """Exit status of a finished run, its findings printed: failing cases first, then
        findings (errors.py)."""
        for line in findings:
            print(printable(line, 2000))
        if self.bad:
            return EXIT_FAILURES
        return EXIT_FINDINGS if findings else EXIT_OK
