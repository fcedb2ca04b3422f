"""What a capture holds, one line per call (``attnbench capture --list FILE``): read from the
checked index only, so listing a safetensors capture reads no tensor and needs no torch."""

from __future__ import annotations

from pathlib import Path

from attnbench.capture.loader import read_index
from attnbench.errors import printable


def _shape(shape: list) -> str:
    return "x".join(str(d) for d in shape)


def call_line(number: int, meta: dict) -> str:
    """``0  blocks.0.attn  q 2x4x64x32 k 2x4x64x32 v 2x4x64x32 bfloat16 causal scale=0.1768
    dropout=0 mask=none dout=yes`` (the layer's name made printable: it came from a file)."""
    flags = [meta["dtype"], "causal" if meta["is_causal"] else "not causal",
             f"scale={meta['scale']:.6g}", f"dropout={meta['dropout_p']:g}",
             f"mask={meta['mask']}"]
    if meta["enable_gqa"]:
        flags.append("gqa")
    flags.append(f"dout={meta['dout']}")
    return printable(f"{number}  {meta['layer'] or '-'}  (call {meta['index']})  "
                     f"q {_shape(meta['q_shape'])} k {_shape(meta['k_shape'])} "
                     f"v {_shape(meta['v_shape'])}  " + " ".join(flags), 2000)


def list_capture(path: Path | str) -> list[str]:
    """A heading line, then one line per recorded call."""
    index = read_index(path)
    head = (f"{printable(path, 400)}: {index.format}, {len(index.calls)} "
            f"call{'' if len(index.calls) == 1 else 's'}, "
            f"{index.data_bytes} bytes of tensors")
    return [head, *(call_line(i, meta) for i, meta in enumerate(index.calls))]
