"""One text per value, equal only for equal values: what case keys and the environments' tally
are made of (10^6 records each, so made in C where orjson is installed)."""

from __future__ import annotations

import json
from typing import Any

_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), check_circular=False)
""":func:`~attnbench.report.read.data.case_key`'s text, its encoder made once (``json.dumps`` with
options makes one a call) and without the check for cycles, which a parsed line cannot have."""


def _json_text(fields: dict[str, Any]) -> bytes:
    return _CANONICAL.encode(fields).encode("utf-8")


def _nonfinite(value: Any) -> bool:
    if isinstance(value, float):
        return value - value != 0.0  # NaN, and inf - inf
    if isinstance(value, (list, tuple)):
        return any(map(_nonfinite, value))
    if isinstance(value, dict):
        return any(map(_nonfinite, value.values()))
    return False


try:  # a case's text in ~5 us, json's in ~8 (a key or two a record, 10^6 records)
    import orjson
except ImportError:  # the same keys from json's text (a box that brings its own environment)
    orjson = None


def canonical_text(fields: dict[str, Any]) -> bytes:
    """The fields as one text, equal only for equal fields (``1``, ``1.0`` and ``true`` apart;
    a list and a tuple alike, as in JSON): orjson's sorted JSON; where orjson refuses the value
    (an int past 64 bits, a lone surrogate) or would write NaN or inf as ``null``, json's text
    after a zero byte (orjson's never starts with one); without orjson, json's text."""
    if orjson is None:
        return _json_text(fields)
    try:
        text = orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return b"\0" + _json_text(fields)
    if b"null" in text and _nonfinite(fields):
        return b"\0" + _json_text(fields)
    return text
