"""What ``attnbench show`` and the end of ``attnbench run`` say about a run, from one pass over
its records: verdict counts per backend, the first failing cases, the accuracy findings and the
exit status.

A run of 10^6 cases is read once and held by nobody (issue 29): :class:`RunSummary` keeps
counts, the :data:`LISTED` failing cases that come first by (verdict, label), and per series and
length the error means of :mod:`~attnbench.report.read.trends` -- never a record. Feed it records
(:meth:`RunSummary.add`, or :meth:`RunSummary.of` an iterable): a list and a stream give the
same text.
"""

from __future__ import annotations

import collections
from typing import Iterable

from attnbench.errors import EXIT_FAILURES, EXIT_FINDINGS, EXIT_OK, printable
from attnbench.report.read.trends import SeriesCollector, fitted
from attnbench.results.records import BAD_VERDICTS, VERDICTS

LISTED = 50
"""Failing cases listed by name (the rest are counted: ``show --all`` lists every case)."""
FINDINGS_LISTED = 20
"""Findings described one per line (all are counted)."""
_PRUNE_AT = 20 * LISTED
"""Failing cases held before keeping only the first :data:`LISTED` again: a sort of 1,000 slim
tuples now and then instead of a heap push per case; memory stays a few hundred KB."""


class RunSummary:
    """A run's records, summarised as they come (see the module docstring)."""

    def __init__(self) -> None:
        self.count = 0
        """Records added (one per case)."""
        self.bad = 0
        """Of them, those whose verdict is bad (:data:`BAD_VERDICTS`)."""
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
            self._failing.append((r["verdict"], r.get("label", ""), self.count, printable(
                f"  {r['verdict']:<8} {str(r.get('id', ''))[:10]}  {r.get('label', '')}: "
                f"{r.get('reason', '')}", 2000)))
            self.bad += 1
            if len(self._failing) >= _PRUNE_AT:
                self._failing = sorted(self._failing)[:LISTED]
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
            lines.append(f"{self.bad} failing cases:")
            lines += [line for *_, line in sorted(self._failing)[:LISTED]]
            if self.bad > LISTED:
                lines.append(f"  ... {self.bad - LISTED} more (attnbench show RUN --all)")
        return "\n".join(lines)

    def findings_text(self) -> list[str]:
        """The accuracy findings across the sweep (:mod:`attnbench.report.read.trends`), one line
        each."""
        found = [t for t in fitted(self._series.series()) if t.finding]
        if not found:
            return []
        return [f"{len(found)} accuracy finding{'s' if len(found) != 1 else ''} (error "
                "growing with the sequence faster than the fused baseline's, or a declared "
                "input-precision tensor over 2x it; every case may still pass; "
                "docs/findings.md):",
                *(f"  FINDING {trend.describe()}" for trend in found[:FINDINGS_LISTED])]

    def exit_status(self, findings: list[str]) -> int:
        """Exit status of a finished run, its findings printed: failing cases first, then
        findings (errors.py)."""
        for line in findings:
            print(printable(line, 2000))
        if self.bad:
            return EXIT_FAILURES
        return EXIT_FINDINGS if findings else EXIT_OK
