"""A captured call as a case: the case fields it fixes, and its tensors, checked by digest.

The pieces a sweep's ``inputs: captured`` needs (issue 42 item 2), apart from the sweep:
:func:`replay_fields` says which case fields a call fixes (batch, lengths, heads, head dims,
mask, dtype) or why it cannot be a case; :func:`contradictions` names the sweep's values that
disagree with them; :func:`file_digest` is the content's sha256 (what a case id carries, so two
runs on different captures never compare as one); :func:`replay_tensors` loads the call's q, k,
v and dout after checking the file is still the one the digest names. Torch-free but for
:func:`replay_tensors`.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import stat
from pathlib import Path
from typing import Any, Mapping, Optional

from attnbench.capture.loader import DEFAULT_MAX_BYTES, CaptureIndex, load_capture
from attnbench.dtypes import DTYPES
from attnbench.errors import CaptureError, printable

CASE_DTYPE = {d.torch_name: d.name for d in DTYPES if not d.is_fp8}
"""A captured dtype -> the case's dtype name (fp8 captures are not replayed: their scales are
not in the file)."""
SCALE_TOLERANCE = 1e-6
"""Relative: a scale passed as ``head_dim ** -0.5`` in fp32 is 1/sqrt(D) to ~6e-8."""
DIGEST_CHARS = 16
"""Hex characters of the sha256 kept: 64 bits, as case ids keep."""
_CHUNK = 1 << 20


def reference(path: str, call: int, digest: str) -> str:
    """How a case names a captured call: ``/abs/acts.safetensors:3@0123456789abcdef``."""
    return f"{path}:{call}@{digest}"


def parse_reference(text: str) -> tuple[str, int, str]:
    """``FILE[:call][@digest]`` -> (file, call (0 when not given), digest or "")."""
    digest = ""
    head, at, tail = text.rpartition("@")
    if at and re.fullmatch(f"[0-9a-f]{{{DIGEST_CHARS}}}", tail):
        text, digest = head, tail
    match = re.fullmatch(r"(.+):([0-9]{1,6})", text, re.S)
    if match:
        return match.group(1), int(match.group(2)), digest
    return text, 0, digest


def _refuse(index: CaptureIndex, call: int, what: str, expected: str) -> CaptureError:
    return CaptureError(printable(f"capture {index.path}:{call}: {what} (expected {expected})",
                                  2000))


def replay_fields(index: CaptureIndex, call: int) -> dict[str, Any]:
    """The case fields call ``call`` fixes, or a one-line :class:`CaptureError` saying why it
    cannot be a case (a layout, mask or scale attnbench's cases do not express)."""
    if not 0 <= call < len(index.calls):
        raise _refuse(index, call, "no such call", f"0..{len(index.calls) - 1}")
    meta = index.calls[call]
    shapes = [meta[f"{p}_shape"] for p in ("q", "k", "v")]
    if any(len(s) != 4 for s in shapes):
        raise _refuse(index, call, f"q, k, v of {len(shapes[0])} dimensions",
                      "(batch, heads, seq, head_dim)")
    (batch, heads_q, seq_q, dim), (batch_k, heads_k, seq_k, dim_k), \
        (batch_v, heads_v, seq_v, dim_v) = shapes
    if not (batch == batch_k == batch_v and heads_k == heads_v and seq_k == seq_v
            and dim == dim_k) or heads_k == 0 or heads_q % heads_k:
        raise _refuse(index, call, f"q {shapes[0]}, k {shapes[1]}, v {shapes[2]}",
                      "one batch, k and v alike, whole GQA groups")
    if meta["dtype"] not in CASE_DTYPE:
        raise _refuse(index, call, f"dtype {meta['dtype']}",
                      "one of " + ", ".join(CASE_DTYPE))
    if meta["mask"] != "none":
        raise _refuse(index, call, f"mask {meta['mask']}",
                      "a call without attn_mask (none or is_causal)")
    if meta["is_causal"] and seq_q != seq_k:
        # sdpa aligns is_causal top-left, attnbench's causal mask bottom-right
        raise _refuse(index, call, f"is_causal with {seq_q} queries and {seq_k} keys",
                      "equal lengths: sdpa's causal mask is aligned top-left, a case's "
                      "bottom-right")
    default = 1.0 / math.sqrt(dim)
    if abs(meta["scale"] - default) > SCALE_TOLERANCE * default:
        raise _refuse(index, call, f"scale {meta['scale']:.8g}",
                      f"1/sqrt(head_dim) = {default:.8g}, the scale of every case")
    return {"batch": batch, "seqlen_q": seq_q, "seqlen_kv": seq_k, "heads_q": heads_q,
            "heads_kv": heads_k, "head_dim": dim, "head_dim_v": dim_v,
            "mask": "causal" if meta["is_causal"] else "none",
            "dtype": CASE_DTYPE[meta["dtype"]]}


def contradictions(fields: Mapping[str, Any], given: Mapping[str, Any]) -> list[str]:
    """``field: the sweep says X, the capture Y`` for each value the sweep gives that the
    capture fixes otherwise (a field the sweep leaves out takes the capture's)."""
    return [f"{name}: the sweep says {given[name]!r}, the capture {value!r}"
            for name, value in fields.items() if name in given and given[name] != value]


def file_digest(path: Path | str, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """The sha256 of the file's bytes (its first :data:`DIGEST_CHARS` hex characters); a file
    larger than ``max_bytes`` plus a header's worth is refused before it is read."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise CaptureError(printable(f"capture {path}: cannot open: {exc.strerror or exc}",
                                     2000)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes + (1 << 21):
            raise CaptureError(printable(f"capture {path}: {info.st_size} bytes or not a "
                                         f"regular file (expected at most {max_bytes})", 2000))
        digest = hashlib.sha256()
        while chunk := os.read(fd, _CHUNK):
            digest.update(chunk)
    finally:
        os.close(fd)
    return digest.hexdigest()[:DIGEST_CHARS]


def replay_tensors(path: Path | str, call: int, digest: str,
                   max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[Any, Any, Any, Optional[Any]]:
    """(q, k, v, dout or None) of call ``call``, on the CPU, after checking the file's digest:
    a capture changed since the sweep was read is refused, not judged as another."""
    found = file_digest(path, max_bytes)
    if found != digest:
        raise CaptureError(printable(f"capture {path}: its digest is {found} (expected "
                                     f"{digest}: the file changed since the sweep was read)",
                                     2000))
    (captured,) = load_capture(path, call, max_bytes)
    tensors = captured.tensors
    return tensors["q"], tensors["k"], tensors["v"], tensors.get("dout")
