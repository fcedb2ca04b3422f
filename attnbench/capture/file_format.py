"""The capture file: what it holds and how it is written.

A capture is a safetensors file (https://github.com/huggingface/safetensors, "format"): an
8-byte little-endian header length N, N bytes of JSON, then the tensors' bytes back to back.
The JSON maps each tensor's name to ``{"dtype", "shape", "data_offsets": [begin, end]}``
(offsets into the bytes after the header) and ``"__metadata__"`` to string values; ours holds
:data:`FORMAT_KEY` and the calls (a JSON list, one dict per call: :data:`CALL_FIELDS`). The
format is simple enough to write here, so a capture needs no package beyond torch and reads
with ``safetensors.torch.load_file`` too. The fallback of ``torch.save`` (a zip of a plain
dict of tensors, the metadata string under :data:`METADATA`) is read as well: files made
where another tool wrote them (:mod:`~.loader`, ``weights_only=True``).

Tensor names: ``<call>.<part>``, the call's index in the file and one of :data:`PARTS`.
Shapes are as the call saw them: ``(batch, heads, seq, head_dim)`` for q, k, v and dout.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping

from attnbench.dtypes import DTYPES

FORMAT_KEY = "attnbench_capture"
FORMAT_VERSION = "1"
METADATA = "__metadata__"
CALLS_KEY = "calls"

PARTS = ("q", "k", "v", "dout", "attn_mask")
"""The tensors a call may have; q, k and v always."""
REQUIRED_PARTS = PARTS[:3]

CALL_FIELDS = ("layer", "index", "q_shape", "k_shape", "v_shape", "dtype", "is_causal",
               "scale", "dropout_p", "mask", "enable_gqa", "dout")
"""What the metadata says of each call. ``index``: the call's number among every
scaled_dot_product_attention call the capture saw (recorded or not); ``scale``: the scale the
call used (its default, 1/sqrt(head_dim), when it passed none); ``mask``: ``none``,
``tensor`` (recorded as ``attn_mask``) or why it was not recorded; ``dout``: ``yes`` or why
not."""

_SAFETENSORS_CODES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
                      "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "bool": "BOOL"}
"""torch dtype name -> safetensors' code, for the dtypes a capture may hold."""
_EXTRA_BYTES = {"float64": 8, "bool": 1}
"""Bytes of the dtypes :data:`attnbench.dtypes.DTYPES` does not declare (the reference's
float64 in a user's fp64 model, a boolean mask)."""
ITEM_BYTES: dict[str, int] = {**{d.torch_name: d.bytes for d in DTYPES}, **_EXTRA_BYTES}
BY_CODE: dict[str, str] = {code: name for name, code in _SAFETENSORS_CODES.items()}
"""safetensors code -> torch dtype name: the only codes a capture file may use."""
ALIGN = 8
"""The header is padded with spaces to a multiple of 8 bytes, as safetensors writes it (the
tensors' bytes then start aligned)."""


def tensor_name(call: int, part: str) -> str:
    return f"{call}.{part}"


def code_of(torch_name: str) -> str:
    """The safetensors code of a torch dtype name (``bfloat16`` -> ``BF16``); KeyError for a
    dtype a capture does not hold."""
    return _SAFETENSORS_CODES[torch_name]


def header_bytes(entries: Mapping[str, tuple[str, tuple[int, ...], int]],
                 metadata: Mapping[str, str]) -> tuple[bytes, list[str]]:
    """The length prefix and JSON header for tensors ``name -> (torch dtype name, shape,
    nbytes)`` in that order, and the names in the order their bytes follow."""
    header: dict[str, Any] = {METADATA: dict(metadata)}
    offset = 0
    for name, (dtype, shape, nbytes) in entries.items():
        header[name] = {"dtype": code_of(dtype), "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-(len(text)) % ALIGN)
    return struct.pack("<Q", len(text)) + text, list(entries)


def write_safetensors(path: Path | str, entries: Mapping[str, tuple[str, tuple[int, ...], int]],
                      metadata: Mapping[str, str],
                      write_tensor: Callable[[str, Any], None]) -> None:
    """Write the file atomically (a new temporary file beside it, renamed: a link planted at
    ``path`` is replaced, never followed); ``write_tensor(name, fh)`` writes one tensor's bytes,
    in the order of ``entries``."""
    prefix, names = header_bytes(entries, metadata)

    def write(fh) -> None:
        fh.write(prefix)
        for name in names:
            write_tensor(name, fh)

    write_atomic(path, write)


def write_atomic(path: Path | str, write: Callable[[Any], None]) -> None:
    """``path`` holds what ``write(fh)`` wrote, whole, or is unchanged: a new temporary file
    beside it (mkstemp: ``O_EXCL | O_NOFOLLOW``, so nothing planted is opened), renamed over
    it (a link at ``path`` is replaced, never followed). Its mode is mkstemp's 0600: a model's
    activations are its owner's until they share them. Raises OSError; no temporary file is
    left. (The capture package sits below results, whose ``files`` does this for runs.)"""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:100]}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def metadata_for(calls: list[dict]) -> dict[str, str]:
    return {FORMAT_KEY: FORMAT_VERSION, CALLS_KEY: json.dumps(calls, separators=(",", ":"))}


def is_zip(first_bytes: bytes) -> bool:
    """A torch.save file (a zip archive) rather than a safetensors one."""
    return first_bytes[:4] == b"PK\x03\x04"


def default_suffix_is_torch(path: Path | str) -> bool:
    """``.pt`` / ``.pth``: the caller asked for torch.save's format."""
    return os.fspath(path).endswith((".pt", ".pth"))
