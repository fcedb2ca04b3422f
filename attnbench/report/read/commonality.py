"""What a run's failing cases have in common, per failing backend, in a line each
("mutant.gqa_dkv_mean: 6 of 12 cases fail; 6 of 6 failures are heads_kv=2 (every such case
fails); only dK/dV fail; out, dQ are clean"): the end of ``attnbench run``, ``attnbench show``
and the report's summary print the same lines.

A broken kernel fails tens of cases whose list names each one, not the pattern. A case-field
value is named only where the failures are concentrated on it: every failure of the backend
has it and not every case of the backend does (a value all its cases share says nothing).
Tensors and checks are named where some checked in the failing cases never fail ("out is
clean") or one kind of check alone fails.

Bounded memory (issue 29: 10^6 records are read once, held by nobody): per backend, per case
field, the count of each value over all its records up to :data:`MAX_VALUES` distinct values
(past that the field only knows it has many), the one value its failures all share so far, and
per tensor and check, how many failing records checked it and how many failed it. Feed records
with :meth:`Commonality.add`; :meth:`Commonality.merge` adds a reader's of the records after
these (``report --jobs``): the lines are those of one pass. Pure data: no torch.
"""

from __future__ import annotations

import collections
import json
from typing import Any, Iterable, Optional

from attnbench.results.records import BAD_VERDICTS, TENSORS
from attnbench.sweep.case import attention_kind

MAX_VALUES = 32
"""Distinct values of a field counted per backend; past this it counts none (the failures can
still share one of them: a field of many values is not shared by every case)."""
MAX_BACKENDS = 1_000
"""Backends tallied (a sweep names a few; the selftest ~40); a record of another is not."""
MAX_TENSORS = 32
"""Distinct tensor and check names tallied per backend (a hostile record may invent any)."""
FEATURES_NAMED = 3
"""Shared values named per backend, the most specific first (fewest cases with the value)."""
BACKENDS_LISTED = 5
"""Failing backends described, most failures first; a line counts the rest."""
SHARED_CHANCE = 0.25
"""A value every failure has is named when failures falling on cases at random would all land
on its cases with odds under this: 38 of 39 cases having softcap=0.0 while 25 fail (odds 0.36)
say nothing; 3 failures all among the 3 heads_kv=2 cases of 6 (0.05) do."""
SPARED_CHANCE = 0.01
"""A value no failure has is named when random failures would all miss its cases with odds
under this (stricter: every value of every field is tried): 14 MHA cases that all pass while 25
of 39 fail (odds 2e-7) are named."""
SPARED_NAMED = 2
"""Values no failure has, named per backend (the most cases first)."""
VALUE_CHARS = 40
"""A value's text is cut to this many characters (a pack's document lengths can be long)."""

_SHOWN = {"out": "out", "dq": "dQ", "dk": "dK", "dv": "dV"}
_MANY = None  # a field's value counts once it holds more than MAX_VALUES values


def value_text(value: Any) -> str:
    """One text per value (a list or mapping as compact JSON), cut to VALUE_CHARS."""
    if isinstance(value, (list, dict)):
        value = json.dumps(value, sort_keys=True, separators=(",", ":"))
    text = str(value)
    return text if len(text) <= VALUE_CHARS else text[:VALUE_CHARS - 3] + "..."


def tensor_of(name: Any) -> str:
    """The tensor a check names: an identity's residual (``dv_v``, ``dq_q``, ``dk_sum``) is its
    gradient's; another name stays as it is."""
    name = str(name)
    head = name.split("_", 1)[0]
    return head if head in TENSORS else name


def case_attention(case: dict) -> str:
    """MHA, GQA or MQA from a stored case's heads ('' where they are not plain integers): a
    bug of the head groups fails GQA and MQA cases, which share no single heads_kv."""
    heads_q, heads_kv = case.get("heads_q"), case.get("heads_kv") or case.get("heads_q")
    if not (type(heads_q) is int and type(heads_kv) is int and 0 < heads_kv <= heads_q):
        return ""
    return attention_kind(heads_q, heads_kv)


def _all_among(failures: int, some: int, cases: int) -> float:
    """Odds that ``failures`` cases drawn at random from ``cases`` all fall among ``some`` of
    them (hypergeometric: C(some, failures) / C(cases, failures)); stops once under 1e-9."""
    odds = 1.0
    for i in range(failures):
        if some - i <= 0:
            return 0.0
        odds *= (some - i) / (cases - i)
        if odds < 1e-9:
            break
    return odds


def _plainest(found: list) -> list:
    """``found`` less the derived ``attention`` value where a field of the case names as many
    cases (heads_kv=2 and attention=GQA are then one set: the field is what the user wrote)."""
    counts = {having for name, _, having in found if name != "attention"}
    return [f for f in found if f[0] != "attention" or f[2] not in counts]


def _count(tallies: dict, texts: dict[str, str]) -> None:
    for name, text in texts.items():
        counts = tallies.get(name, collections.Counter())
        if counts is not _MANY:
            counts[text] += 1
            tallies[name] = counts if len(counts) <= MAX_VALUES else _MANY


def failed_tensors(record: dict) -> set[str]:
    """The tensors (:func:`tensor_of`) of a record's failed checks."""
    return {tensor_of(c.get("tensor")) for c in record.get("checks") or []
            if isinstance(c, dict) and c.get("passed") is False}


class _Backend:
    """One backend's tallies (see the module docstring)."""

    __slots__ = ("cases", "values", "failed_values", "failures", "verdicts", "shared", "judged",
                 "checked", "failed", "kinds_made", "kinds_failed")

    def __init__(self) -> None:
        self.cases = 0
        self.values: dict[str, Optional[collections.Counter]] = {}
        self.failed_values: dict[str, Optional[collections.Counter]] = {}
        """The same counts over the failures only."""
        self.failures = 0
        self.verdicts: collections.Counter = collections.Counter()
        self.shared: Optional[dict[str, str]] = None
        """Field -> the value every failure so far has (None: no failure yet)."""
        self.judged = 0  # failures with checks (verdict fail)
        self.checked: collections.Counter = collections.Counter()  # tensor -> failures checking it
        self.failed: collections.Counter = collections.Counter()  # tensor -> failures failing it
        self.kinds_made: collections.Counter = collections.Counter()  # check -> failures making it
        self.kinds_failed: collections.Counter = collections.Counter()

    def add(self, case: dict, record: dict) -> None:
        self.cases += 1
        texts = {k: value_text(v) for k, v in case.items() if k != "backend"}
        kind = case_attention(case)
        if kind:
            texts["attention"] = kind
        _count(self.values, texts)
        verdict = record.get("verdict")
        if verdict not in BAD_VERDICTS:
            return
        _count(self.failed_values, texts)
        self.failures += 1
        self.verdicts[verdict] += 1
        self.shared = texts if self.shared is None else {
            k: v for k, v in self.shared.items() if texts.get(k) == v}
        checks = [c for c in record.get("checks") or [] if isinstance(c, dict)]
        if verdict != "fail" or not checks:
            return
        self.judged += 1
        # An identity ties two tensors (<dQ,Q> = <dK,K>): its failure is not a tensor's whose
        # own reference or baseline checks all pass (a wrong dK breaks dq_q with dQ right).
        direct = collections.defaultdict(set)
        for c in checks:
            if c.get("check") != "identity":
                direct[tensor_of(c.get("tensor"))].add(c.get("passed") is False)
        made = {(tensor_of(c.get("tensor")), str(c.get("check"))): c.get("passed") is False
                and not (c.get("check") == "identity"
                         and direct.get(tensor_of(c.get("tensor"))) == {False})
                for c in checks}
        for counter, names in ((self.checked, {t for t, _ in made}),
                               (self.failed, {t for (t, _), bad in made.items() if bad}),
                               (self.kinds_made, {k for _, k in made}),
                               (self.kinds_failed, {k for (_, k), bad in made.items() if bad})):
            for name in names:
                if name in counter or len(counter) < MAX_TENSORS:
                    counter[name] += 1

    def merge(self, other: "_Backend") -> None:
        self.cases += other.cases
        for kept, added in ((self.values, other.values),
                            (self.failed_values, other.failed_values)):
            for name, theirs in added.items():
                mine = kept.get(name, collections.Counter())
                if mine is _MANY or theirs is _MANY:
                    kept[name] = _MANY
                    continue
                mine.update(theirs)
                kept[name] = mine if len(mine) <= MAX_VALUES else _MANY
        self.failures += other.failures
        self.verdicts.update(other.verdicts)
        if other.shared is not None:
            self.shared = dict(other.shared) if self.shared is None else {
                k: v for k, v in self.shared.items() if other.shared.get(k) == v}
        self.judged += other.judged
        for mine, theirs in ((self.checked, other.checked), (self.failed, other.failed),
                             (self.kinds_made, other.kinds_made),
                             (self.kinds_failed, other.kinds_failed)):
            for name, n in theirs.items():
                if name in mine or len(mine) < MAX_TENSORS:
                    mine[name] += n

    # -- the words -----------------------------------------------------------------------------
    def concentrated(self) -> list[tuple[str, str, Optional[int]]]:
        """(field, value, cases with it or None where the field had too many values to count)
        that every failure has and not every case: the fewest cases first."""
        found = []
        for name, text in (self.shared or {}).items():
            counts = self.values.get(name)
            having = None if counts is _MANY else counts[text]
            if having is None or _all_among(self.failures, having, self.cases) < SHARED_CHANCE:
                found.append((name, text, having))
        return _plainest(sorted(found, key=lambda f: (f[2] is None, f[2] or 0, f[0])))

    def spared(self) -> list[tuple[str, str, int]]:
        """(field, value, cases with it) that no failure has, where random failures would hit
        its cases but for odds under SPARED_CHANCE: the most cases first."""
        found = []
        for name, counts in self.values.items():
            failed = self.failed_values.get(name)
            if counts is _MANY or failed is _MANY:
                continue
            found += [(name, text, having) for text, having in counts.items()
                      if having < self.cases and not (failed or {}).get(text)
                      and _all_among(self.failures, self.cases - having,
                                     self.cases) < SPARED_CHANCE]
        return _plainest(sorted(found, key=lambda f: (-f[2], f[0], f[1])))

    def line(self, backend: str) -> Optional[str]:
        """The backend's line, or None where it says nothing beyond the counts."""
        n = self.failures
        verdicts = "" if set(self.verdicts) == {"fail"} else " (" + ", ".join(
            f"{k} {v}" for k, v in sorted(self.verdicts.items(), key=lambda kv: -kv[1])) + ")"
        said = []
        if n == self.cases:
            said.append("every case fails")
        features = self.concentrated()
        if features:
            named = [f"{name}={text}" + ("" if having is None else " (every such case fails)"
                                         if having == n else f" ({n} of {having} such cases fail)")
                     for name, text, having in features[:FEATURES_NAMED]]
            more = len(features) - FEATURES_NAMED
            said.append(f"{n} of {n} failures are " + ", ".join(named)
                        + (f" and share {more} more values" if more > 0 else ""))
        # A field named above holds every failure in one value: its other values are spared
        # by implication (heads_kv=2 named, "no failure has heads_kv=4" says nothing more).
        spared = [f for f in self.spared() if f[0] not in {name for name, _, _ in features}]
        spared = spared[:SPARED_NAMED]
        if spared:
            said.append("no failure has " + " or ".join(
                f"{name}={text} ({having} such cases pass)" for name, text, having in spared))
        said += self._tensor_words()
        if not said:
            return None
        return f"{backend}: {n} of {self.cases} cases fail{verdicts}; " + "; ".join(said)

    def _tensor_words(self) -> list[str]:
        failing = sorted(self.failed, key=_tensor_order)
        if not failing:
            return []
        words = []
        clean = [t for t in sorted(self.checked, key=_tensor_order) if t not in self.failed]
        if clean:
            counts = "" if all(self.failed[t] == self.judged for t in failing) else " (" + \
                ", ".join(f"{_SHOWN.get(t, t)} in {self.failed[t]}" for t in failing) + \
                f" of {self.judged})"
            verb = "fails" if len(failing) == 1 else "fail"
            words.append(f"only {'/'.join(_SHOWN.get(t, t) for t in failing)} {verb}{counts}")
            words.append(f"{', '.join(_SHOWN.get(t, t) for t in clean)} "
                         f"{'is' if len(clean) == 1 else 'are'} clean")
        if len(self.kinds_failed) == 1 and len(self.kinds_made) > 1:
            words.append(f"only {next(iter(self.kinds_failed))} checks fail")
        return words


def _tensor_order(name: str) -> tuple[int, str]:
    return (TENSORS.index(name), "") if name in TENSORS else (len(TENSORS), name)


class Commonality:
    """What the failing records share, per backend (see the module docstring)."""

    def __init__(self) -> None:
        self._backends: dict[str, _Backend] = {}

    def add(self, record: dict) -> None:
        case = record.get("case")
        if not isinstance(case, dict):
            return
        backend = str(case.get("backend", "?"))
        tally = self._backends.get(backend)
        if tally is None:
            if len(self._backends) >= MAX_BACKENDS:
                return
            tally = self._backends[backend] = _Backend()
        tally.add(case, record)

    def has_room(self, backends: Iterable[str]) -> bool:
        """Whether every one of ``backends`` is tallied, or can be (:data:`MAX_BACKENDS`): then
        the order in which their records come does not choose which are."""
        new = set(backends) - self._backends.keys()
        return len(self._backends) + len(new) <= MAX_BACKENDS

    def add_counts(self, backend: str, cases: int, texts: dict[str, dict[str, int]]) -> None:
        """What :meth:`add` tallies of ``cases`` records of ``backend`` that are not failures,
        in bulk: per case field (and ``attention``), how many have each value's text
        (:func:`value_text`). The columns of a journal block (:mod:`attnbench.report.show.
        columns`)."""
        tally = self._backends.get(backend)
        if tally is None:
            if len(self._backends) >= MAX_BACKENDS:
                return
            tally = self._backends[backend] = _Backend()
        tally.cases += cases
        for name, counted in texts.items():
            counts = tally.values.get(name, collections.Counter())
            if counts is not _MANY:
                counts.update(counted)
                tally.values[name] = counts if len(counts) <= MAX_VALUES else _MANY

    def merge(self, other: "Commonality") -> None:
        """Add what ``other`` tallied of the records after these."""
        for backend, theirs in other._backends.items():
            mine = self._backends.get(backend)
            if mine is None:
                if len(self._backends) < MAX_BACKENDS:
                    self._backends[backend] = theirs
            else:
                mine.merge(theirs)

    def lines(self) -> list[str]:
        """A heading and a line per failing backend that has something to say (most failures
        first, at most :data:`BACKENDS_LISTED`); [] where none has."""
        failing = sorted(((b, t) for b, t in self._backends.items() if t.failures),
                         key=lambda bt: (-bt[1].failures, bt[0]))
        said = [line for b, t in failing if (line := t.line(b)) is not None]
        if not said:
            return []
        out = ["What the failing cases share:", *(f"  {line}" for line in said[:BACKENDS_LISTED])]
        if len(said) > BACKENDS_LISTED:
            out.append(f"  ... and {len(said) - BACKENDS_LISTED} more failing backends "
                       "(attnbench show RUN --all)")
        return out
