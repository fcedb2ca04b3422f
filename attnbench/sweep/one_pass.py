"""Every mistake of a sweep in one pass: its cases are still checked when some fields are wrong.

A field mistake (``mask: casual``) used to stop the reading before the product was expanded, so
a case mistake (``heads_kv: 3`` with 4 query heads) showed only once the first was fixed.
:class:`Doubt` records what the field mistakes leave unknown, so that the product of what is
valid is checked without inventing mistakes: a value that was wrong is left out of its axis; a
case that would take a wrong default from the field table is still checked, but its mistakes
that name that field are held back (they would be about a value the sweep did not mean); a case
a broken exclude might remove is not checked; a sweep whose sections are unreadable is not
expanded at all. :class:`SharedCauses` says a cause that many cases share once, with a count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from attnbench.errors import SweepError
from attnbench.validation import Problems, near_miss

SHOWN_CASES = 2
"""Cases named on the line of a shared cause; the count says how many share it."""


@dataclass(slots=True)
class Doubt:
    """What the field mistakes found so far leave unknown about the cases."""

    blind: bool = False
    """Nothing can be expanded that means what the sweep meant (a section is unreadable, an
    unknown top-level key may be a misspelt ``axes``, a ``-s`` field lost all its values)."""
    fields: set[str] = field(default_factory=set)
    """Fields whose default is unknown (its value was wrong, or its key misspelt) or whose whole
    axis is: a case that takes such a field from nowhere is built with the table's default."""
    excludes: list[dict] = field(default_factory=list)
    """The valid part of each exclude entry with a mistake: a case that matches it may be one
    the entry removes."""
    shaky: set[str] = field(default_factory=set)
    """Fields with a wrong value anywhere: an exclude naming one may match only what was left
    out, so it is not called unused."""

    def misspelt(self, key: Any, known) -> None:
        """A key that is no field: the field it is probably a misspelling of is unknown."""
        meant = near_miss(key, known)
        if meant:
            self.fields.add(meant)
            self.shaky.add(meant)

    def skips(self, values: Mapping[str, Any]) -> bool:
        """Whether the case of ``values`` may be one a broken exclude removes."""
        return any(all(values.get(k, _ABSENT) == v for k, v in ex.items())
                   for ex in self.excludes)

    def holds_back(self, values: Mapping[str, Any], message: str) -> bool:
        """Whether a case mistake may come from a default the sweep did not mean: it names a
        field the case takes from nowhere while its given value was wrong."""
        return any(name not in values and re.search(rf"\b{re.escape(name)}\b", message)
                   for name in self.fields)


_ABSENT = object()


class SharedCauses:
    """Case mistakes gathered by cause: 40 cases that fail alike are one line
    ``heads_kv: got 3, expected ... (40 cases: axes(...), axes(...), ...)``, not 40. Bounded
    whatever the product's size: the first :data:`SHOWN_CASES` cases of a cause are kept, the
    others counted, and causes past :attr:`Problems.LIMIT` only counted (they would not be
    shown)."""

    def __init__(self) -> None:
        self._by_cause: dict[str, tuple[list[str], list[int]]] = {}
        self._unshown = 0

    def add(self, where: str, exc: SweepError) -> None:
        for line in str(exc).split("\n"):
            cause = line[len(where) + 2:] if line.startswith(f"{where}: ") else line
            if cause not in self._by_cause:
                if len(self._by_cause) >= Problems.LIMIT:
                    self._unshown += 1
                    continue
                self._by_cause[cause] = ([], [0])
            wheres, count = self._by_cause[cause]
            count[0] += 1
            if len(wheres) < SHOWN_CASES:
                wheres.append(where)

    def report(self, problems: Problems) -> None:
        for cause, (wheres, (count,)) in self._by_cause.items():
            problems.add(SweepError(shared_line(cause, wheres, count)))
        problems.count += self._unshown


def shared_line(cause: str, wheres: list[str], count: int) -> str:
    """``WHERE: CAUSE`` for one case; ``CAUSE (N cases: W1, W2, ...)`` for several."""
    if count == 1:
        return f"{wheres[0]}: {cause}"
    more = ", ..." if count > len(wheres) else ""
    return f"{cause} ({count} cases: {', '.join(wheres)}{more})"


def valid_part(entry: Any, norm, check_name) -> dict:
    """The fields of an exclude or include entry that are valid (no mistake reported: the
    entry's own reading reports them)."""
    if not isinstance(entry, Mapping):
        return {}
    out: dict = {}
    for key, value in entry.items():
        try:
            check_name("", key)
            out.update(norm("", key, value))
        except SweepError:
            continue
    return out
