"""Checks for what users hand attnbench: sweeps, dashboards, journals and manifests.

One place for the typed value rules every field and option goes through (a sweep's
fields and options in :mod:`attnbench.sweep`, a stored record's case and a manifest's options in
:mod:`attnbench.results.store`), for reading a small input file without trusting its size or kind,
and for parsing YAML and JSON strictly. Every mistake is a :class:`~attnbench.errors.UserError`
whose message shows a bounded part of the input (:func:`~attnbench.errors.short_repr`).
"""

from __future__ import annotations

import contextlib
import difflib
import json
import math
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import yaml

from attnbench.errors import SweepError, UserError, printable, short_repr

MAX_SWEEP_BYTES = 1 << 20
"""A sweep (or dashboard) file larger than 1 MiB is refused unread: the shipped sweeps are under
5 KB, and a file that never ends (``/dev/zero``) must not hang ``validate``."""

# -- typed values ------------------------------------------------------------------------------


def positive_int_argument(text: str) -> int:
    """argparse ``type=`` for counts (``--workers``, ``--slots``, ``--nthreads``): an integer
    >= 1, else argparse's one-line usage error."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"got {short_repr(text)}, expected a positive integer")
    return value


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def fail(where: str, given: Any, allowed: str) -> SweepError:
    """``WHERE: got X, expected Y`` (X bounded: see :func:`~attnbench.errors.short_repr`)."""
    return SweepError(f"{where}: got {short_repr(given)}, expected {allowed}")


def suggestion(given: Any, known: Sequence[str]) -> str:
    """`` (did you mean seqlen_q?)`` when ``given`` is a near miss of one of ``known``: the one
    place every field, key and enum value (``casual``, ``bfloat61``) is hinted from."""
    close = near_miss(given, known)
    return f" (did you mean {close}?)" if close else ""


def near_miss(given: Any, known: Sequence[str]) -> str:
    """The name of ``known`` that ``given`` probably meant ('' for none): a close spelling
    (difflib's ratio >= 0.6), the same name in another case, or a word of it (``per_head`` for
    ``head``)."""
    if not isinstance(given, str) or len(given) > 100:
        return ""
    names = [str(k) for k in known]
    close = difflib.get_close_matches(given, names, n=1, cutoff=0.6)
    if not close:
        close = [k for k in names if k.lower() == given.lower()]
    if not close:  # 'per_head' -> 'head', 'causal_mask' -> 'causal'
        words = [w for w in re.split(r"[^A-Za-z0-9]+", given.lower()) if len(w) > 2]
        close = [k for w in words for k in difflib.get_close_matches(w, names, n=1, cutoff=0.75)]
    return close[0] if close else ""


def unknown_name(where: str, given: Any, known: Sequence[str], what: str) -> SweepError:
    """``WHERE: unknown field 'seqlen' (did you mean seqlen_q?), expected one of ...``."""
    return SweepError(f"{where}: unknown {what} {short_repr(given)}{suggestion(given, known)}, "
                      f"expected one of {', '.join(map(str, known))}")


_FIELD_PATH = re.compile(r"[A-Za-z_][\w.\[\]]*")
"""A place in a document (``axes.backend[0]``, ``include[1].heads_kv``): a line naming one is a
mistake at that place, and the same mistake at several places is one line."""


class Problems:
    """The mistakes of one input, gathered in one pass so that a user fixes a file once rather
    than once per mistake. ``with problems.check(): ...`` records a :class:`SweepError` raised
    inside and goes on after the block; :meth:`raise_any` raises them together, one line each,
    prefixed by the file's name (a ``-s`` override names itself instead)."""

    LIMIT = 30
    """Lines shown; the rest are counted (one bad value in a 10^5-case product is 10^5 lines)."""

    def __init__(self, filename: str):
        self.filename = filename
        self.messages: list[str] = []
        self.count = 0
        self.overridden: set[str] = set()
        """Document paths set by ``-s`` (``options.timeout_s``): their mistakes name ``-s``."""
        self._by_cause: dict[str, int] = {}
        self._places: dict[int, list[str]] = {}
        self._folded = 0
        """A message's cause (after ``place: ``) -> its line, and the places that share it."""

    def __bool__(self) -> bool:
        return self.count > 0

    def add(self, exc: SweepError) -> None:
        for line in str(exc).split("\n"):
            self.count += 1
            where, sep, cause = line.partition(": ")
            shared = self._by_cause.get(cause) if sep and _FIELD_PATH.fullmatch(where) else None
            if shared is not None:  # the same mistake at another place: said once, with both
                if where not in self._places[shared] and len(self._places[shared]) < 1000:
                    self._places[shared].append(where)
                self._folded += 1
                continue
            if len(self.messages) < self.LIMIT and line not in self.messages:
                if sep and _FIELD_PATH.fullmatch(where):
                    self._by_cause[cause] = len(self.messages)
                    self._places[len(self.messages)] = [where]
                self.messages.append(line)

    @contextlib.contextmanager
    def check(self) -> Iterator[None]:
        try:
            yield
        except SweepError as exc:
            self.add(exc)

    def raise_any(self) -> None:
        if not self.count:
            return
        by_hand = tuple(f"{path}:" for path in self.overridden)
        lines = [m if m.startswith(("-s ", f"{self.filename}: ")) else
                 f"-s {m}" if by_hand and m.startswith(by_hand) else f"{self.filename}: {m}"
                 for m in self.messages]
        for index, places in self._places.items():
            if len(places) > 1:
                shown = ", ".join(places[1:4]) + (", ..." if len(places) > 4 else "")
                lines[index] += f" (the same at {len(places) - 1} more places: {shown})"
        unshown = self.count - len(self.messages) - self._folded
        if unshown > 0:
            lines.append(f"{self.filename}: ... {unshown} more mistakes like these")
        raise SweepError("\n".join(lines))


@dataclass(frozen=True, slots=True)
class Int:
    """An integer in [lo, hi]."""

    lo: int
    hi: int
    expected: str = ""
    """How the message names the range (default ``an integer in [lo, hi]``)."""

    def check(self, where: str, value: Any) -> int:
        if not is_int(value):
            raise fail(where, value, "an integer")
        if not self.lo <= value <= self.hi:
            raise fail(where, value, self.expected or f"an integer in [{self.lo}, {self.hi}]")
        return value


@dataclass(frozen=True, slots=True)
class Real:
    """A finite number in [lo, hi] (``lo_open``: lo itself excluded; likewise ``hi_open``)."""

    lo: float
    hi: float
    lo_open: bool = False
    hi_open: bool = False
    expected: str = ""

    def check(self, where: str, value: Any) -> float:
        ok = (is_number(value) and math.isfinite(value)
              and (self.lo < value if self.lo_open else self.lo <= value)
              and (value < self.hi if self.hi_open else value <= self.hi))
        if not ok:
            raise fail(where, value, self.expected or (
                f"a number in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}"
                f"{')' if self.hi_open else ']'}"))
        return float(value)


@dataclass(frozen=True, slots=True)
class PowerOfTwo:
    """0, or a power of two <= hi."""

    hi: int

    def check(self, where: str, value: Any) -> int:
        if not is_int(value) or value < 0 or value > self.hi or value & (value - 1):
            raise fail(where, value, f"0 or a power of two <= {self.hi}")
        return value


@dataclass(frozen=True, slots=True)
class Choice:
    choices: tuple[str, ...]
    hints: tuple[str, ...] = ()
    """Other spellings a sweep may use (dtype aliases, turned into a choice before this
    check): a near miss of one is hinted too (``bfloat61``: did you mean bfloat16?)."""

    def check(self, where: str, value: Any) -> str:
        if not isinstance(value, str) or value not in self.choices:
            raise fail(where, value, "one of " + ", ".join(self.choices)
                       + suggestion(value, self.choices + self.hints))
        return value


@dataclass(frozen=True, slots=True)
class Flag:
    def check(self, where: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise fail(where, value, "true or false")
        return value


@dataclass(frozen=True, slots=True)
class Name:
    """A non-empty string of at most ``limit`` characters matching ``pattern``."""

    pattern: str
    expected: str
    limit: int = 200

    def check(self, where: str, value: Any) -> str:
        if (not isinstance(value, str) or not 0 < len(value) <= self.limit
                or not re.fullmatch(self.pattern, value)):
            raise fail(where, value, f"{self.expected} (at most {self.limit} characters)")
        return value


# -- files and formats ---------------------------------------------------------------------------


READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
"""How every file of a run directory (or any input) is opened for reading: without blocking, so
a FIFO planted at a name answers at once instead of waiting forever for a writer."""


def open_regular(path: str | Path) -> int:
    """A read-only descriptor of the regular file at ``path`` (:data:`READ_FLAGS`). Raises
    :class:`OSError`, and :class:`ValueError` ("not a regular file") for a directory, a FIFO, a
    socket or a device (``/dev/zero``), closed again."""
    fd = os.open(path, READ_FLAGS)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError("not a regular file")
    return fd


def read_bounded(path: str | Path, limit: int, whole: bool = True) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (:func:`open_regular`: a FIFO
    cannot hang it, ``/dev/zero`` is refused). Raises :class:`OSError`, and
    :class:`ValueError` (its message says why) for what is not such a file or, when ``whole``,
    a file over ``limit`` (found by reading ``limit + 1`` bytes at most, whatever its size
    claims); not ``whole``: its first ``limit`` bytes."""
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if whole and info.st_size > limit:
            raise ValueError(f"{info.st_size} bytes, more than the {limit} it may have")
        data = fh.read(limit + 1 if whole else limit)
    if len(data) > limit:
        raise ValueError(f"more than the {limit} bytes it may have")
    return data


def read_span(path: str | Path, offset: int, limit: int) -> tuple[bytes, int]:
    """At most ``limit`` bytes of the regular file at ``path`` from ``offset`` (from the end
    when negative), and the file's size then: a log followed as it grows, read a bounded piece
    at a time (:func:`open_regular`). An ``offset`` past the end reads nothing."""
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fd).st_size
        fh.seek(max(0, size + offset) if offset < 0 else min(offset, size))
        return fh.read(limit), size


def read_input_file(path: str | Path, what: str, error: type[UserError] = SweepError) -> str:
    """The text of a small input file (a sweep, a dashboard): a regular file of at most
    :data:`MAX_SWEEP_BYTES`, UTF-8. Anything else (a directory, ``/dev/zero``, a FIFO, a
    10 GB file) raises ``error`` with one line, without reading it."""
    try:
        data = read_bounded(path, MAX_SWEEP_BYTES)
    except OSError as exc:
        raise error(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    except ValueError as exc:
        why = f"; expected a {what} (YAML)" if str(exc) == "not a regular file" else \
            f" (a {what})"
        raise error(f"{path}: {exc}{why}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start})") from None


MAX_INT_DIGITS = 4300
"""An integer in YAML with more decimal digits than this is refused where it is read, one line:
Python's own limit on converting such text (``sys.get_int_max_str_digits``), which would
otherwise raise deep inside the parser -- or, for a hex or binary literal it does not limit,
when the number is printed in a message. No field takes more than 19 digits (int64)."""
_INT_LIMIT = 10 ** MAX_INT_DIGITS


class _Strict:
    """Safe YAML (plain data, no tags that construct objects) that also refuses what YAML would
    accept quietly: a key given twice in one mapping (the last would win), merge keys
    (``<<``, whose nesting multiplies a mapping's size exponentially, as aliases cannot) and
    integers too long to print (:data:`MAX_INT_DIGITS`)."""

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise yaml.constructor.ConstructorError(
                    None, None, "merge keys (<<) are not supported; give the values once in "
                    "defaults or as include entries", key_node.start_mark)
            if isinstance(key_node, yaml.ScalarNode):
                key = self.construct_object(key_node)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {short_repr(key)} given twice in one mapping (YAML "
                        "would keep only the last)", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node):
        text = str(node.value)
        too_long = yaml.constructor.ConstructorError(
            None, None, f"an integer of more than {MAX_INT_DIGITS} decimal digits (Python's "
            "limit; no field takes more than 19)", node.start_mark)
        if len(text) > 4 * MAX_INT_DIGITS:  # no conversion at all: bounded work
            raise too_long
        try:
            value = super().construct_yaml_int(node)
        except ValueError:  # Python's digit limit
            raise too_long from None
        if abs(value) >= _INT_LIMIT:  # 0x..., 0b..., 1:2:3 (base 60): not limited
            raise too_long
        return value


class StrictYamlLoader(_Strict, yaml.SafeLoader):
    """:class:`_Strict` on PyYAML's pure-Python parser: what a mistake's message and place are
    taken from (libyaml words some differently)."""


class _FastStrictLoader(_Strict, getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """:class:`_Strict` on libyaml's parser where PyYAML has it (its wheels do): the same safe
    constructor and resolver, the parsing in C -- a 0.93 MB sweep in 0.8 s of CPU instead of
    4.7 s (40 s under load). Without libyaml, the pure-Python parser: the same, slower."""


for _loader in (StrictYamlLoader, _FastStrictLoader):
    _loader.add_constructor("tag:yaml.org,2002:int", _loader.construct_yaml_int)


MAX_YAML_NODES = 200_000
"""Values (scalars, lists, mappings, aliases) one YAML document may hold, counted from the
parser's events before anything is built: the shipped sweeps hold under 500, a 10,000-case
include list about 120,000. Building is what costs (~5 us a value, and a value an axis turns
into a case ~140 us: 500,000 zeros took 104 s, under load); counting, ~1 us a value, stops at
the bound (0.2 s)."""
MAX_YAML_ALIASES = 1_000
"""Aliases (``*name``) one document may use: a sweep has none or a few; 250,000 took 36 s."""
MAX_YAML_ITEMS = 10_000
"""Items one YAML list may have: an axis listed value by value (a longer one is a range,
``{range: [start, stop, step]}``, counted before it is expanded), a pack's lengths (at most
4,096 sequences), an include list. 400,000 lengths took 17.4 s to refuse after being built."""
_NODE_EVENTS = (yaml.ScalarEvent, yaml.AliasEvent, yaml.SequenceStartEvent,
                yaml.MappingStartEvent)
_START_EVENTS = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_END_EVENTS = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


def yaml_too_big(text: str) -> str | None:
    """Why ``text`` holds more than a sweep or dashboard can (:data:`MAX_YAML_NODES`,
    :data:`MAX_YAML_ALIASES`, :data:`MAX_YAML_ITEMS`), with the place, or None: counted from
    the parser's events (libyaml where PyYAML has it), stopping at the first bound passed,
    before any value is built. Malformed YAML is None here (its parse says what is wrong)."""
    nodes = aliases = 0
    open_lists: list[list] = []  # [items so far, where it starts, is a list] of each open one
    try:
        for event in yaml.parse(text, Loader=_FastStrictLoader):  # noqa: S506 (events only)
            if isinstance(event, _END_EVENTS):
                open_lists.pop()
                continue
            if not isinstance(event, _NODE_EVENTS):
                continue
            nodes += 1
            at = event.start_mark
            if nodes > MAX_YAML_NODES:
                return f"{_place(at)}: more than {MAX_YAML_NODES:,} values in one file (a " \
                       "sweep holds a few hundred)"
            if isinstance(event, yaml.AliasEvent):
                aliases += 1
                if aliases > MAX_YAML_ALIASES:
                    return f"{_place(at)}: more than {MAX_YAML_ALIASES:,} aliases (*name) in " \
                           "one file"
            if open_lists and open_lists[-1][2]:
                parent = open_lists[-1]
                parent[0] += 1
                if parent[0] > MAX_YAML_ITEMS:
                    return f"{_place(parent[1])}: a list of more than {MAX_YAML_ITEMS:,} " \
                           "items (an axis of more values is a range: {range: [start, stop, " \
                           "step]})"
            if isinstance(event, _START_EVENTS):
                open_lists.append([0, at, isinstance(event, yaml.SequenceStartEvent)])
    except (yaml.YAMLError, RecursionError, IndexError):
        return None
    return None


def _place(mark) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"


def load_yaml(text: str, filename: str, error: type[UserError] = SweepError) -> Any:
    """``text`` parsed by :class:`StrictYamlLoader`; a mistake is one line naming the place.
    Counted before it is built (:func:`yaml_too_big`): a file of too many values, aliases or
    list items is refused in a fraction of a second, one line."""
    too_big = yaml_too_big(text)
    if too_big:
        raise error(f"{filename}: {too_big}")
    try:
        return yaml.load(text, Loader=_FastStrictLoader)  # noqa: S506 (a SafeLoader)
    except (yaml.YAMLError, RecursionError):
        pass  # parsed again below, for the message and place the pure-Python parser gives
    try:
        return yaml.load(text, Loader=StrictYamlLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = (f"line {mark.line + 1}, column {mark.column + 1}" if mark else
                 f"character {exc.position + 1}" if isinstance(exc, yaml.reader.ReaderError)
                 else "?")
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise error(f"{filename}: malformed YAML at {where}: {printable(problem, 300)}") from None
    except RecursionError:
        raise error(f"{filename}: malformed YAML: nested too deeply") from None


def parse_json(text: str) -> Any:
    """JSON as the journal and the manifest are written (``allow_nan=False``): ``NaN``,
    ``Infinity``, floats that overflow and integers beyond int64 are refused (ValueError), and
    nesting too deep for the parser is a ValueError too."""
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float,
                          parse_int=_int64)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is out of range")
    return value


def _int64(text: str) -> int:
    value = int(text)
    if not -2**63 <= value < 2**63:
        raise ValueError(f"{text[:40]}... is beyond int64")
    return value


@dataclass(frozen=True, slots=True)
class Lengths:
    """A non-empty list of sequence lengths (a packed case's ``seqlens_q`` / ``seqlens_kv``):
    at most ``max_count`` integers in [0, ``max_each``] whose sum is in [1, ``max_total``].
    A zero-length document is allowed (varlen batches have them: a padded slot, a cache not
    filled yet); a pack of no tokens at all is not. Returned as a tuple (cases are hashable)."""

    max_count: int
    max_each: int
    max_total: int

    def check(self, where: str, value: Any) -> tuple[int, ...]:
        if not isinstance(value, (list, tuple)) or not value:
            raise fail(where, value, "a non-empty list of sequence lengths")
        if len(value) > self.max_count:
            raise SweepError(f"{where}: got {len(value)} sequences, expected at most "
                             f"{self.max_count}")
        for i, x in enumerate(value):
            if not is_int(x) or not 0 <= x <= self.max_each:
                raise fail(f"{where}[{i}]", x, f"an integer in [0, {self.max_each}] (0: an "
                           "empty document)")
        if sum(value) < 1:
            raise fail(where, list(value), "at least one token in all (every length is 0)")
        if sum(value) > self.max_total:
            raise fail(where, f"sum {sum(value)}", f"a total of at most {self.max_total} tokens")
        return tuple(int(x) for x in value)
