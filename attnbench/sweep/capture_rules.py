"""``inputs: captured``: a case whose q, k, v (and dout) are one call of a capture file
(:mod:`attnbench.capture`), its shapes taken from the capture.

``captured: FILE[:call]`` (call 0 when not given; FILE relative to the directory the command
runs in) becomes ``/abs/FILE:call@digest``: the sha256 of the file's content is part of the
case, so of its id and its record, and two runs on different captures never compare as one
(the id keeps the call and digest, not the directory: the same file elsewhere is the same case).
The call fixes batch, lengths, heads, head dims, mask and dtype; a sweep value that says
otherwise is an error naming both, and a field the sweep leaves out takes the capture's.
Read once per file (header only, torch-free: validate needs no torch).
"""

from __future__ import annotations

import os
from typing import Any

from attnbench.capture.loader import CaptureIndex, read_index
from attnbench.capture.replay import (contradictions, file_digest, parse_reference, reference,
                                      replay_fields)
from attnbench.errors import CaptureError, SweepError

CAPTURED = "captured"
"""The ``inputs`` kind of a captured case."""

_SEEN: dict[tuple, tuple[CaptureIndex, str]] = {}
"""(path, size, mtime) -> (index, digest): a sweep's cases share a few captures."""


def _read(path: str) -> tuple[CaptureIndex, str]:
    try:
        info = os.stat(path)
    except OSError as exc:
        raise CaptureError(f"capture {path}: cannot open: {exc.strerror or exc}") from None
    key = (path, info.st_size, info.st_mtime_ns)
    if key not in _SEEN:
        _SEEN.clear()  # one capture's index at a time is kept: they may hold 2048 calls
        _SEEN[key] = (read_index(path), file_digest(path))
    return _SEEN[key]


def resolve_capture(where: str, values: dict[str, Any]) -> None:
    """Fill ``values`` (a case's resolved sweep values) from its capture, in place; raises
    :class:`SweepError` with one line per problem."""
    if values.get("inputs") != CAPTURED:
        raise SweepError(f"{where}: captured: given with inputs "
                         f"{values.get('inputs', 'normal')!r}, expected inputs: {CAPTURED}")
    if not values.get(CAPTURED):
        raise SweepError(f"{where}: inputs: {CAPTURED} needs captured: FILE[:call]")
    for field in ("seqlens_q", "seqlens_kv", "decode"):  # (a page_size needs decode)
        if values.get(field):
            raise SweepError(f"{where}: {field}: a captured case is dense attention, expected "
                             f"no {field} with inputs: {CAPTURED}")
    file, call, digest = parse_reference(values[CAPTURED])
    path = os.path.abspath(file)
    try:
        index, found = _read(path)
        fields = replay_fields(index, call)
    except CaptureError as exc:
        raise SweepError(f"{where}: captured: {exc}") from None
    if digest and digest != found:
        raise SweepError(f"{where}: captured: {path} has digest {found}, expected {digest} "
                         "(the case names another capture)")
    wrong = contradictions(fields, values)
    if wrong:
        raise SweepError("\n".join(f"{where}: {line} ({path}:{call}; leave it out to take "
                                   "the capture's)" for line in wrong))
    values.update(fields)
    values[CAPTURED] = reference(path, call, found)
