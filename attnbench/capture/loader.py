"""Reading a capture file from anyone: data only, every size checked before it is allocated.

A capture travels between people (a bug report's attachment), so it is read as hostile input:
nothing in it runs (the safetensors header is parsed here, with no library; a torch.save file is
opened with ``weights_only=True``), the header is bounded (:data:`MAX_HEADER_BYTES`), every
tensor's dtype is one a capture holds, its shape is bounded (:data:`MAX_NDIM`,
:data:`MAX_DIM`), its bytes lie inside the file and are exactly dtype x shape, the tensors
tile the data with no gap or overlap, and their total is under ``max_bytes`` -- all before a
byte of tensor data is read. The metadata must agree with the tensors (a call's shapes, dtype,
whether it has dout and a mask). Any problem is one line, ``capture FILE: what (expected
...)``, a :class:`attnbench.errors.CaptureError` (exit 2).

The index (:func:`read_index`) needs no torch for a safetensors file; the tensors
(:func:`load_capture`) do.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from attnbench.capture.file_format import (BY_CODE, CALL_FIELDS, CALLS_KEY, FORMAT_KEY,
                                           FORMAT_VERSION, ITEM_BYTES, METADATA, PARTS,
                                           REQUIRED_PARTS, is_zip, tensor_name)
from attnbench.errors import CaptureError, exception_summary, printable

MAX_HEADER_BYTES = 1 << 20
"""1 MiB: a capture's header is ~300 bytes a call, so this holds thousands of calls; a header
that claims more is refused before it is read."""
MAX_CALLS = 2048
MAX_NDIM = 8
MAX_DIM = 1 << 31
DEFAULT_MAX_BYTES = 16 << 30
"""16 GiB of tensor data: what one replay may allocate on the host unless the caller says."""
MAX_PICKLE_BYTES = 4 << 20
"""The torch.save fallback's ``data.pkl`` (a dict of tensor references and the metadata
string): a few KiB a call."""
MAX_LAYER_CHARS = 200


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the file: where its bytes are (absolute offsets), before any is read."""

    name: str
    dtype: str
    """torch's name of its dtype (``bfloat16``)."""
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class CaptureIndex:
    """What a capture file holds, checked: the calls' metadata and the tensors' places."""

    path: str
    format: str
    """``safetensors`` or ``torch.save``."""
    calls: tuple[dict, ...]
    tensors: dict[str, TensorEntry]
    loaded: Optional[dict] = None
    """A torch.save file's tensors (loading it is the only way to read its index)."""

    @property
    def data_bytes(self) -> int:
        return sum(e.end - e.begin for e in self.tensors.values())


@dataclass(frozen=True)
class CapturedCall:
    """One recorded call: its metadata (:data:`attnbench.capture.file_format.CALL_FIELDS`) and
    its tensors by part (q, k, v; dout and attn_mask where recorded)."""

    meta: dict
    tensors: dict


def _bad(path: object, what: str, expected: str = "") -> CaptureError:
    tail = f" (expected {expected})" if expected else ""
    return CaptureError(printable(f"capture {path}: {what}{tail}", 2000))


def _open(path: Path | str) -> tuple[int, int]:
    """An fd on a regular file (a FIFO is opened without blocking and refused) and its size."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise _bad(path, f"cannot open: {exc.strerror or exc}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise _bad(path, "not a regular file", "a capture written by attnbench capture")
    return fd, info.st_size


def _pread_exact(fd: int, size: int, offset: int, path: object) -> bytearray:
    buf = bytearray(size)
    view, done = memoryview(buf), 0
    while done < size:
        if hasattr(os, "preadv"):  # straight into the buffer: no second copy of a tensor
            got = os.preadv(fd, [view[done:]], offset + done)
        else:
            chunk = os.pread(fd, size - done, offset + done)
            view[done:done + len(chunk)] = chunk
            got = len(chunk)
        if not got:
            raise _bad(path, f"truncated: {offset + done} bytes, a tensor ends at "
                       f"{offset + size}", "the file as written")
        done += got
    return buf


def read_index(path: Path | str, max_bytes: int = DEFAULT_MAX_BYTES) -> CaptureIndex:
    """The checked index of a capture file (see the module's docstring for what is checked)."""
    fd, size = _open(path)
    try:
        first = os.pread(fd, 8, 0)
        if is_zip(first):
            return _torch_index(path, fd, size, max_bytes)
        return _safetensors_index(path, fd, size, first, max_bytes)
    finally:
        os.close(fd)


def _safetensors_index(path, fd: int, size: int, first: bytes, max_bytes: int) -> CaptureIndex:
    if len(first) < 8:
        raise _bad(path, f"{size} bytes", "8 bytes of header length, then the header")
    (length,) = struct.unpack("<Q", first)
    if length > MAX_HEADER_BYTES:
        raise _bad(path, f"header of {length} bytes", f"at most {MAX_HEADER_BYTES}")
    if 8 + length > size:
        raise _bad(path, f"header of {length} bytes in a file of {size}",
                   "a header inside the file")
    raw = os.pread(fd, length, 8)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _bad(path, f"header is not JSON: {exception_summary(exc, 120)}") from None
    if not isinstance(header, dict):
        raise _bad(path, "header is not a JSON object")
    metadata = header.pop(METADATA, None)
    entries = _entries(path, header, data_start=8 + length)
    _check_tiling(path, entries, data_bytes=size - 8 - length, max_bytes=max_bytes)
    calls = _calls(path, metadata, entries)
    return CaptureIndex(os.fspath(path), "safetensors", calls, entries)


def _entries(path, header: dict, data_start: int) -> dict[str, TensorEntry]:
    if len(header) > MAX_CALLS * len(PARTS):
        raise _bad(path, f"{len(header)} tensors", f"at most {MAX_CALLS * len(PARTS)}")
    out = {}
    for name, entry in header.items():
        shown = printable(name, 60)
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise _bad(path, f"tensor {shown}: not a tensor entry",
                       "{dtype, shape, data_offsets}")
        code, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if code not in BY_CODE:
            raise _bad(path, f"tensor {shown}: dtype {printable(code, 20)}",
                       "one of " + ", ".join(BY_CODE))
        dtype = BY_CODE[code]
        shape = _shape(path, shown, shape)
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(_is_int(o) and o >= 0 for o in offsets) or offsets[0] > offsets[1]):
            raise _bad(path, f"tensor {shown}: data_offsets {printable(offsets, 60)}",
                       "[begin, end], 0 <= begin <= end")
        nbytes = math.prod(shape) * ITEM_BYTES[dtype]  # Python ints: no overflow
        if offsets[1] - offsets[0] != nbytes:
            raise _bad(path, f"tensor {shown}: {offsets[1] - offsets[0]} bytes for shape "
                       f"{list(shape)} of {dtype}", f"{nbytes}")
        out[name] = TensorEntry(name, dtype, shape, data_start + offsets[0],
                                data_start + offsets[1])
    return out


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shape(path, shown: str, shape: object) -> tuple[int, ...]:
    if (not isinstance(shape, list) or len(shape) > MAX_NDIM
            or not all(_is_int(d) and 0 <= d <= MAX_DIM for d in shape)):
        raise _bad(path, f"tensor {shown}: shape {printable(shape, 60)}",
                   f"at most {MAX_NDIM} sizes, each 0..{MAX_DIM}")
    return tuple(shape)


def _check_tiling(path, entries: dict[str, TensorEntry], data_bytes: int,
                  max_bytes: int) -> None:
    """The tensors' bytes follow each other from the first data byte to the last: a gap
    hides data, an overlap aliases two tensors, a short file is truncated."""
    total = sum(e.end - e.begin for e in entries.values())
    if total > max_bytes:
        raise _bad(path, f"{total} bytes of tensors", f"at most {max_bytes}")
    at = min((e.begin for e in entries.values()), default=0)
    start = at
    for entry in sorted(entries.values(), key=lambda e: (e.begin, e.end)):
        if entry.begin != at:
            raise _bad(path, f"tensor {printable(entry.name, 60)} starts at byte "
                       f"{entry.begin - start}", f"{at - start}: tensors back to back")
        at = entry.end
    if at - start != data_bytes:
        what = "truncated" if at - start > data_bytes else "trailing bytes"
        raise _bad(path, f"{what}: {data_bytes} bytes of data after the header, the tensors "
                   f"take {at - start}", "the file as written")


def _calls(path, metadata: object, entries: dict) -> tuple[dict, ...]:
    """The calls the metadata describes, each checked against its tensors."""
    if not isinstance(metadata, dict) or metadata.get(FORMAT_KEY) != FORMAT_VERSION:
        raise _bad(path, "no attnbench capture metadata",
                   f"__metadata__ with {FORMAT_KEY}: {FORMAT_VERSION}")
    text = metadata.get(CALLS_KEY)
    try:
        calls = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):
        calls = None
    if not isinstance(calls, list) or len(calls) > MAX_CALLS:
        raise _bad(path, "metadata calls", f"a JSON list of at most {MAX_CALLS} calls")
    used = set()
    for i, call in enumerate(calls):
        _check_call(path, i, call, entries)
        used |= {tensor_name(i, p) for p in PARTS if tensor_name(i, p) in entries}
    stray = sorted(set(entries) - used)
    if stray:
        raise _bad(path, f"tensor {printable(stray[0], 60)} belongs to no call",
                   "<call>.<" + "|".join(PARTS) + ">")
    return tuple(calls)


def _check_call(path, i: int, call: object, entries: dict) -> None:
    where = f"call {i}"
    if not isinstance(call, dict) or set(call) != set(CALL_FIELDS):
        raise _bad(path, f"{where}: metadata fields", ", ".join(CALL_FIELDS))
    if not isinstance(call["layer"], str) or len(call["layer"]) > MAX_LAYER_CHARS:
        raise _bad(path, f"{where}: layer", f"a name of at most {MAX_LAYER_CHARS} characters")
    for part in REQUIRED_PARTS:
        entry = entries.get(tensor_name(i, part))
        if entry is None:
            raise _bad(path, f"{where}: no tensor {tensor_name(i, part)}", "q, k and v")
        if call[f"{part}_shape"] != list(entry.shape):
            raise _bad(path, f"{where}: metadata says {part} is "
                       f"{printable(call[f'{part}_shape'], 60)}, the tensor is "
                       f"{list(entry.shape)}", "the same shape")
        if len(entry.shape) < 2 or entry.dtype != call["dtype"]:
            raise _bad(path, f"{where}: {part} is {entry.dtype} {list(entry.shape)}",
                       f"{printable(call['dtype'], 20)}, (..., seq, head_dim)")
    for part, field, present in (("dout", "dout", "yes"), ("attn_mask", "mask", "tensor")):
        has = tensor_name(i, part) in entries
        if has != (call[field] == present):
            raise _bad(path, f"{where}: {field} is {printable(call[field], 40)} but the "
                       f"tensor {tensor_name(i, part)} is {'there' if has else 'absent'}",
                       "metadata that agrees with the tensors")
    dout = entries.get(tensor_name(i, "dout"))
    if dout is not None and (dout.dtype != call["dtype"] or len(dout.shape) < 2):
        raise _bad(path, f"{where}: dout is {dout.dtype} {list(dout.shape)}",
                   f"{printable(call['dtype'], 20)}")
    for field in ("is_causal", "enable_gqa"):
        if not isinstance(call[field], bool):
            raise _bad(path, f"{where}: {field} is {printable(call[field], 20)}", "a boolean")
    for field in ("scale", "dropout_p"):
        if not isinstance(call[field], (int, float)) or isinstance(call[field], bool) \
                or not math.isfinite(call[field]):
            raise _bad(path, f"{where}: {field} is {printable(call[field], 20)}",
                       "a finite number")


# -- the torch.save fallback --------------------------------------------------------------------

def _torch_index(path, fd: int, size: int, max_bytes: int) -> CaptureIndex:
    """A torch.save zip: its entries stored (torch never compresses; a deflated entry could be
    a bomb), their sizes under the caps, then ``torch.load(weights_only=True)``: no code runs."""
    with os.fdopen(os.dup(fd), "rb") as fh:
        try:
            archive = zipfile.ZipFile(fh)
            infos = archive.infolist()
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise _bad(path, f"not a readable zip: {exception_summary(exc, 120)}") from None
        if len(infos) > MAX_CALLS * len(PARTS) + 16:
            raise _bad(path, f"{len(infos)} zip entries", f"at most {MAX_CALLS * len(PARTS)}")
        for info in infos:
            if info.compress_type != zipfile.ZIP_STORED:
                raise _bad(path, f"zip entry {printable(info.filename, 60)} is compressed",
                           "stored entries, as torch.save writes them")
            if info.filename.endswith("data.pkl") and info.file_size > MAX_PICKLE_BYTES:
                raise _bad(path, f"data.pkl of {info.file_size} bytes",
                           f"at most {MAX_PICKLE_BYTES}")
        total = sum(info.file_size for info in infos)
        if total > max_bytes + MAX_PICKLE_BYTES or total > size:
            raise _bad(path, f"{total} bytes in its zip entries, a file of {size}",
                       f"at most {max_bytes} bytes of tensors, inside the file")
        fh.seek(0)
        import torch

        try:
            obj = torch.load(fh, map_location="cpu", weights_only=True)
        except Exception as exc:  # hostile bytes: whatever the unpickler raises is one line
            raise _bad(path, f"not loadable as data (weights_only=True): "
                       f"{exception_summary(exc, 160)}") from None
    return _index_of_loaded(path, obj, max_bytes)


def _index_of_loaded(path, obj: object, max_bytes: int) -> CaptureIndex:
    import torch

    if not isinstance(obj, dict) or not isinstance(obj.get(METADATA), str):
        raise _bad(path, "not a capture", f"a dict of tensors with a {METADATA} string")
    try:
        metadata = json.loads(obj[METADATA])
    except (ValueError, RecursionError):
        metadata = None
    entries, at, tensors = {}, 0, {}
    for name, tensor in obj.items():
        if name == METADATA:
            continue
        shown = printable(name, 60)
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
            raise _bad(path, f"entry {shown} is not a tensor", "a dict of tensors")
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype not in BY_CODE.values():
            raise _bad(path, f"tensor {shown}: dtype {dtype}",
                       "one of " + ", ".join(BY_CODE.values()))
        shape = _shape(path, shown, list(tensor.shape))
        nbytes = tensor.numel() * ITEM_BYTES[dtype]
        entries[name] = TensorEntry(name, dtype, shape, at, at + nbytes)
        tensors[name] = tensor.contiguous()
        at += nbytes
    if at > max_bytes:
        raise _bad(path, f"{at} bytes of tensors", f"at most {max_bytes}")
    calls = _calls(path, metadata, entries)
    return CaptureIndex(os.fspath(path), "torch.save", calls, entries, loaded=tensors)


# -- the tensors --------------------------------------------------------------------------------

def load_capture(path: Path | str, call: Optional[int] = None,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> list[CapturedCall]:
    """The recorded calls (one, with ``call``), their tensors on the CPU, bit for bit as the
    model's calls saw them."""
    index = read_index(path, max_bytes)
    chosen = range(len(index.calls)) if call is None else [call]
    if call is not None and not 0 <= call < len(index.calls):
        raise _bad(path, f"no call {call}", f"0..{len(index.calls) - 1}")
    if index.loaded is not None:
        return [CapturedCall(index.calls[i], {p: index.loaded[tensor_name(i, p)] for p in PARTS
                                              if tensor_name(i, p) in index.loaded})
                for i in chosen]
    if sys.byteorder != "little":
        raise _bad(path, "this host is big-endian", "a little-endian host (safetensors' order)")
    fd, size = _open(path)
    try:
        return [CapturedCall(index.calls[i], {
            p: _read_tensor(fd, index.tensors[tensor_name(i, p)], path)
            for p in PARTS if tensor_name(i, p) in index.tensors}) for i in chosen]
    finally:
        os.close(fd)


def _read_tensor(fd: int, entry: TensorEntry, path) -> Any:
    import torch

    dtype = getattr(torch, entry.dtype)
    if entry.end == entry.begin:
        return torch.empty(entry.shape, dtype=dtype)
    raw = torch.frombuffer(_pread_exact(fd, entry.end - entry.begin, entry.begin, path),
                           dtype=torch.uint8)
    if dtype == torch.bool:  # a byte other than 0/1 is no bool torch can hold
        return (raw != 0).reshape(entry.shape)
    return raw.view(dtype).reshape(entry.shape)
