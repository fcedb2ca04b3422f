"""A capture from anyone is data: hostile files get one line, before anything is allocated,
and nothing in them runs."""

from __future__ import annotations

import json
import os
import struct
import time
import tracemalloc
import zipfile

import pytest
import torch

from attnbench.capture.file_format import metadata_for
from attnbench.capture.loader import MAX_HEADER_BYTES, load_capture, read_index
from attnbench.capture.recorder import capture_attention
from attnbench.errors import CaptureError


def _meta(shape=(1, 2, 8, 4), dtype="float32", **over) -> dict:
    call = {"layer": "l", "index": 0, "q_shape": list(shape), "k_shape": list(shape),
            "v_shape": list(shape), "dtype": dtype, "is_causal": False, "scale": 0.5,
            "dropout_p": 0.0, "mask": "none", "enable_gqa": False,
            "dout": "no gradient flows to its output"}
    return {**call, **over}


def _write(path, tensors: dict, calls: list, data: bytes | None = None,
           metadata: dict | None = None) -> None:
    """A safetensors file from ``name -> (code, shape, [begin, end])``; ``data`` defaults to
    zeros up to the largest end."""
    header = {"__metadata__": metadata_for(calls) if metadata is None else metadata}
    header.update({n: {"dtype": c, "shape": list(s), "data_offsets": list(o)}
                   for n, (c, s, o) in tensors.items()})
    text = json.dumps(header).encode()
    if data is None:
        data = bytes(max((o[1] for _, _, o in tensors.values()), default=0))
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def _good(path, shape=(1, 2, 8, 4)) -> None:
    nbytes = 4 * 64
    _write(path, {f"0.{p}": ("F32", shape, [i * nbytes, (i + 1) * nbytes])
                  for i, p in enumerate("qkv")}, [_meta(shape)])


def _refused(path, match: str) -> str:
    with pytest.raises(CaptureError, match=match) as info:
        load_capture(path)
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"capture {path}: ")
    return text


def test_a_well_formed_file_loads(tmp_path):
    _good(tmp_path / "c.safetensors")
    (call,) = load_capture(tmp_path / "c.safetensors")
    assert call.tensors["q"].shape == (1, 2, 8, 4) and not call.tensors["v"].any()


def test_a_truncated_file_is_refused(tmp_path):
    path = tmp_path / "c.safetensors"
    with capture_attention(path):
        q = torch.randn(1, 2, 8, 4)
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
    data = path.read_bytes()
    path.write_bytes(data[:-1])  # one byte short: the margin
    _refused(path, r"truncated: 767 bytes of data after the header, the tensors take 768")
    path.write_bytes(data + b"\0")
    _refused(path, "trailing bytes")


def test_a_header_longer_than_the_file_or_the_cap_is_refused_unread(tmp_path):
    path = tmp_path / "c.safetensors"
    path.write_bytes(struct.pack("<Q", 100) + b"{}")
    _refused(path, r"header of 100 bytes in a file of 10 \(expected a header inside the file\)")
    path.write_bytes(struct.pack("<Q", MAX_HEADER_BYTES + 1) + bytes(MAX_HEADER_BYTES + 1))
    _refused(path, rf"header of {MAX_HEADER_BYTES + 1} bytes \(expected at most")
    path.write_bytes(b"\x01\x02")
    _refused(path, "2 bytes")


@pytest.mark.parametrize("header", [b"not json", b"[" * 100_000, b"[1, 2]", b"\xff\xfe"])
def test_a_header_that_is_not_a_json_object_is_refused(tmp_path, header):
    path = tmp_path / "c.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    _refused(path, "header is not")


def test_a_lying_shape_is_refused(tmp_path):
    path = tmp_path / "c.safetensors"
    # q claims 1x2x8x5 (320 bytes) over 256 bytes: off by one head_dim
    _write(path, {"0.q": ("F32", (1, 2, 8, 5), [0, 256]), "0.k": ("F32", (1, 2, 8, 4), [256, 512]),
                  "0.v": ("F32", (1, 2, 8, 4), [512, 768])}, [_meta()])
    _refused(path, r"tensor 0.q: 256 bytes for shape \[1, 2, 8, 5\] of float32 \(expected 320\)")


def test_a_huge_shape_is_refused_before_anything_is_allocated(tmp_path):
    path = tmp_path / "c.safetensors"
    huge = (10_000, 10_000, 10_000)  # 1e12 elements, 4 TB of float32
    _write(path, {"0.q": ("F32", huge, [0, 4 * 10**12]),
                  "0.k": ("F32", huge, [4 * 10**12, 8 * 10**12]),
                  "0.v": ("F32", huge, [8 * 10**12, 12 * 10**12])},
           [_meta(huge)], data=b"")
    tracemalloc.start()
    start = time.perf_counter()
    _refused(path, r"12000000000000 bytes of tensors \(expected at most 17179869184\)")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1 << 20 and time.perf_counter() - start < 1.0  # margin: 1e6x below 4 TB
    # a dimension past 2^31, and more than 8 of them
    _write(path, {"0.q": ("F32", (2**31 + 1,), [0, 4])}, [_meta()], data=b"")
    _refused(path, r"shape \[2147483649\] \(expected at most 8 sizes, each 0..2147483648\)")
    _write(path, {"0.q": ("F32", (1,) * 9, [0, 4])}, [_meta()], data=b"")
    _refused(path, "expected at most 8 sizes")


@pytest.mark.parametrize("code", ["I64", "F4", "U8", "<script>"])
def test_a_dtype_a_capture_does_not_hold_is_refused(tmp_path, code):
    path = tmp_path / "c.safetensors"
    _write(path, {"0.q": (code, (4,), [0, 8])}, [_meta()])
    text = _refused(path, r"tensor 0.q: dtype .* \(expected one of F64, F32, F16, BF16")
    assert "<script>" not in text or code == "<script>"


def test_tensors_that_overlap_or_leave_gaps_are_refused(tmp_path):
    path = tmp_path / "c.safetensors"
    entries = {"0.q": ("F32", (1, 2, 8, 4), [0, 256]), "0.k": ("F32", (1, 2, 8, 4), [128, 384]),
               "0.v": ("F32", (1, 2, 8, 4), [384, 640])}
    _write(path, entries, [_meta()])
    _refused(path, r"tensor 0.k starts at byte 128 \(expected 256: tensors back to back\)")
    entries["0.k"] = ("F32", (1, 2, 8, 4), [260, 516])
    _write(path, entries, [_meta()])
    _refused(path, "tensor 0.k starts at byte 260")


def test_metadata_that_disagrees_with_the_tensors_is_refused(tmp_path):
    path = tmp_path / "c.safetensors"
    tensors = {f"0.{p}": ("F32", (1, 2, 8, 4), [i * 256, (i + 1) * 256])
               for i, p in enumerate("qkv")}
    _write(path, tensors, [_meta(q_shape=[1, 2, 8, 8])])
    _refused(path, r"call 0: metadata says q is \[1, 2, 8, 8\], the tensor is \[1, 2, 8, 4\]")
    _write(path, tensors, [_meta(dout="yes")])
    _refused(path, "call 0: dout is yes but the tensor 0.dout is absent")
    _write(path, tensors, [_meta(), _meta()])
    _refused(path, "call 1: no tensor 1.q")
    _write(path, tensors, [_meta(scale=float("nan"))], )
    _refused(path, "call 0: scale is nan")
    _write(path, {**tensors, "7.q": ("F32", (1,), [768, 772])}, [_meta()])
    _refused(path, "tensor 7.q belongs to no call")
    _write(path, tensors, [], metadata={"format": "pt"})
    _refused(path, "no attnbench capture metadata")


def test_a_fifo_or_a_directory_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "c.safetensors"
    os.mkfifo(fifo)
    _refused(fifo, r"not a regular file")
    _refused(tmp_path, r"not a regular file")
    _refused(tmp_path / "absent", "cannot open: No such file")


class _Payload:
    """Unpickling this runs ``open(marker, 'w')``: what a hostile torch.save file would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_torch_save_file_with_code_in_it_never_runs_it(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "c.pt"
    q = torch.zeros(1, 2, 8, 4)
    torch.save({"0.q": q, "0.k": q, "0.v": q, "__metadata__": json.dumps(
        metadata_for([_meta()])), "payload": _Payload(marker)}, path)
    _refused(path, r"not loadable as data \(weights_only=True\)")
    assert not marker.exists()
    # a bare pickle (no zip) is not read as one either
    import pickle

    path.write_bytes(pickle.dumps(_Payload(marker)))
    _refused(path, "header of")
    assert not marker.exists()


def test_a_torch_save_file_is_checked_as_a_safetensors_one(tmp_path):
    path = tmp_path / "c.pt"
    q = torch.zeros(1, 2, 8, 4)
    torch.save({"0.q": q, "0.k": q, "0.v": q.to(torch.int64),
                "__metadata__": json.dumps(metadata_for([_meta()]))}, path)
    _refused(path, r"tensor 0.v: dtype int64 \(expected one of float64")
    torch.save({"0.q": q, "0.k": q, "0.v": q,
                "__metadata__": json.dumps(metadata_for([_meta()]))}, path)
    assert read_index(path).format == "torch.save"
    # the same archive deflated: torch never compresses, a compressed entry could be a bomb
    deflated = tmp_path / "d.pt"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(deflated, "w",
                                                       zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    _refused(deflated, r"is compressed \(expected stored entries")
    assert read_index(path, max_bytes=10**9).data_bytes == 3 * 256
    with pytest.raises(CaptureError, match=r"768 bytes of tensors \(expected at most 767\)"):
        read_index(path, max_bytes=767)


def test_the_safetensors_package_reads_a_capture_bit_for_bit(tmp_path):
    """The file is plain safetensors (checked with safetensors 0.8.0, installed apart: the
    project does not depend on it)."""
    st = pytest.importorskip("safetensors.torch", reason="safetensors is not installed")
    path = tmp_path / "c.safetensors"
    q = torch.randn(1, 2, 8, 4, dtype=torch.bfloat16, requires_grad=True)
    mask = torch.eye(8, dtype=torch.bool)
    with capture_attention(path):
        torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask).float() \
            .sum().backward()
    theirs = st.load_file(str(path))
    (ours,) = load_capture(path)
    assert sorted(theirs) == sorted(f"0.{p}" for p in ours.tensors)
    assert all(torch.equal(ours.tensors[name[2:]], t) for name, t in theirs.items())
