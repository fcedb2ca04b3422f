"""Recording the attention calls of a user's own model: q, k, v and dout, as the calls saw them.

``with capture_attention("acts.safetensors", model=model, layers=["blocks.3.*"]) as cap:``
replaces ``torch.nn.functional.scaled_dot_product_attention`` for the duration (restored on
exit, whatever happened) by a wrapper that calls the original and copies the chosen calls'
inputs to the CPU (detached, contiguous, bit for bit); when the output takes part in a backward
inside the block, a tensor hook copies the gradient that reaches it (dout). On exit the file is
written (:mod:`~.file_format`), also when the block raised: what was seen up to the error is
what a bug report needs.

Which calls: a call's layer is the innermost name active around it -- a module of ``model``
whose name matches ``layers`` (fnmatch patterns over ``model.named_modules()``; every named
module when ``layers`` is None) or a ``with cap.layer("name"):`` block. With ``layers`` given, a
call whose layer matches none is not recorded. At most ``max_calls`` calls and ``max_bytes`` of
tensors (a call that does not fit is counted, not recorded; a dout or mask that does not fit is
left out and the metadata says why).

Eager mode only: a call inside ``torch.compile`` is traced, not run, and a model that imported
the function itself (``from torch.nn.functional import scaled_dot_product_attention``) calls
the original, which this cannot replace.
"""

from __future__ import annotations

import contextlib
import fnmatch
import math
import threading
from pathlib import Path
from typing import Iterator, Optional, Sequence

from attnbench.capture.file_format import (ITEM_BYTES, METADATA, default_suffix_is_torch,
                                           metadata_for, tensor_name, write_atomic,
                                           write_safetensors)
from attnbench.capture.loader import MAX_CALLS, MAX_LAYER_CHARS
from attnbench.errors import CaptureError, os_error_text

DEFAULT_MAX_CALLS = 16
DEFAULT_MAX_BYTES = 1 << 30
"""1 GiB of host memory (and file): a 32k-token bf16 call of 32 heads x 128 is 256 MiB of
q, k, v and dout, so a few such calls fit."""

_ACTIVE_LOCK = threading.Lock()
_active: Optional["AttentionRecorder"] = None


def _bind(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):
    """scaled_dot_product_attention's arguments by name (its signature, torch 2.5+)."""
    return dict(query=query, key=key, value=value, attn_mask=attn_mask, dropout_p=dropout_p,
                is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)


def _cpu_copy(tensor):
    import torch

    out = torch.empty(tuple(tensor.shape), dtype=tensor.dtype, device="cpu")
    return out.copy_(tensor.detach())


def _nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size()


class AttentionRecorder:
    """The state of one capture (use :func:`capture_attention`). ``summary()`` says what was
    recorded and skipped once the block ended."""

    def __init__(self, path: Path | str, model=None, layers: Optional[Sequence[str]] = None,
                 max_calls: int = DEFAULT_MAX_CALLS, max_bytes: int = DEFAULT_MAX_BYTES):
        if not 1 <= max_calls <= MAX_CALLS:
            raise CaptureError(f"capture {path}: max_calls {max_calls} (expected 1..{MAX_CALLS})")
        if max_bytes < 1:
            raise CaptureError(f"capture {path}: max_bytes {max_bytes} (expected > 0)")
        self.path = Path(path)
        self.model = model
        self.layers = [layers] if isinstance(layers, str) else list(layers or ())
        self.max_calls, self.max_bytes = max_calls, max_bytes
        self.calls: list[dict] = []
        """Per recorded call: its metadata and its tensors (``"tensors"``: part -> tensor)."""
        self.skipped: dict[str, int] = {}
        self.seen = 0
        self.bytes = 0
        self._lock = threading.Lock()
        self._local = threading.local()
        self._handles: list = []
        self._original = None
        self._open = False
        self._names: dict[int, dict[int, str]] = {}

    # -- layer names ------------------------------------------------------------------------
    def _stack(self) -> list[str]:
        if not hasattr(self._local, "names"):
            self._local.names = []
        return self._local.names

    @contextlib.contextmanager
    def layer(self, name: str) -> Iterator[None]:
        """Calls inside are named ``name`` (innermost wins)."""
        stack = self._stack()
        stack.append(str(name)[:MAX_LAYER_CHARS])
        try:
            yield
        finally:
            stack.pop()

    def _hook_model(self) -> None:
        for name, module in self.model.named_modules():
            if not name or (self.layers and not self._wanted(name)):
                continue
            self._handles.append(module.register_forward_pre_hook(self._enter_module(name)))
            # always_call: a forward that raises still leaves the stack as it found it
            self._handles.append(module.register_forward_hook(self._leave_module,
                                                              always_call=True))

    def _enter_module(self, name: str):
        def hook(_module, _args) -> None:  # returns None: the arguments are left alone
            self._stack().append(name[:MAX_LAYER_CHARS])
        return hook

    def _leave_module(self, _module, _args, _out) -> None:  # None: the output is left alone
        stack = self._stack()
        if stack:
            stack.pop()

    def _hook_every_module(self) -> None:
        """No model given: every module's forward, named as its outermost module (the model a
        forward started from) names it (``blocks.3.attn``)."""
        from torch.nn.modules import module as nn_module

        self._handles.append(nn_module.register_module_forward_pre_hook(self._enter_any))
        self._handles.append(nn_module.register_module_forward_hook(self._leave_any,
                                                                    always_call=True))

    def _enter_any(self, module, _args) -> None:
        modules = self._local.__dict__.setdefault("modules", [])
        if not modules:
            name = ""
        else:
            root = modules[0]
            names = self._names.get(id(root))
            if names is None:  # once per model: a forward may reach thousands of modules
                names = self._names[id(root)] = {id(m): n for n, m in root.named_modules()}
            name = names.get(id(module))
            if name is None:  # not a registered submodule of the model: its parent's + class
                parent = self._stack()[-1] if self._stack() else ""
                name = f"{parent}.{type(module).__name__}".lstrip(".")
        modules.append(module)
        self._stack().append(name[:MAX_LAYER_CHARS])

    def _leave_any(self, _module, _args, _out) -> None:
        modules = self._local.__dict__.setdefault("modules", [])
        if modules:
            modules.pop()
            self._leave_module(_module, _args, _out)

    def _wanted(self, layer: str) -> bool:
        return not self.layers or any(fnmatch.fnmatchcase(layer, p) for p in self.layers)

    # -- the wrapper --------------------------------------------------------------------------
    def __enter__(self) -> "AttentionRecorder":
        global _active
        import torch.nn.functional as F

        with _ACTIVE_LOCK:
            if _active is not None:
                raise CaptureError(f"capture {self.path}: a capture to {_active.path} is already "
                                   "recording (expected one capture at a time)")
            _active, self._open = self, True
            self._original = F.scaled_dot_product_attention
            F.scaled_dot_product_attention = _wrapper(self._original, self)
        if self.model is not None:
            self._hook_model()
        else:
            self._hook_every_module()
        return self

    def __exit__(self, *exc_info) -> None:
        global _active
        import torch.nn.functional as F

        with _ACTIVE_LOCK:
            if getattr(F.scaled_dot_product_attention, "_attnbench_recorder", None) is self:
                F.scaled_dot_product_attention = self._original
            _active = None
        with self._lock:
            self._open = False
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.write()

    def observe(self, args: tuple, kwargs: dict, out) -> None:
        """Record one call (the wrapper's job, after the original returned ``out``)."""
        import torch

        try:
            call = _bind(*args, **kwargs)
        except TypeError:
            return self._skip("arguments not understood")
        q, k, v, mask = call["query"], call["key"], call["value"], call["attn_mask"]
        with self._lock:
            index, self.seen = self.seen, self.seen + 1
            stack = self._stack()
            layer = stack[-1] if stack else ""
            if not self._wanted(layer):
                return self._skip_locked("layer not chosen")
            if len(self.calls) >= self.max_calls:
                return self._skip_locked("over max_calls")
            tensors = (q, k, v)
            if not all(type(t) is torch.Tensor and not t.is_nested for t in tensors) \
                    or len({t.dtype for t in tensors}) != 1 \
                    or str(q.dtype).removeprefix("torch.") not in ITEM_BYTES or q.dim() < 2:
                return self._skip_locked("inputs not plain dense tensors of one float dtype")
            need = sum(map(_nbytes, tensors))
            if self.bytes + need > self.max_bytes:
                return self._skip_locked("over max_bytes")
            self.bytes += need
            mask_text, keep_mask = self._mask(mask)
            if keep_mask:
                self.bytes += _nbytes(mask)
            wants_dout = torch.is_grad_enabled() and isinstance(out, torch.Tensor) \
                and out.requires_grad
            dout_text = "no backward reached it inside the capture"
            if not wants_dout:
                dout_text = "no gradient flows to its output"
            elif self.bytes + _nbytes(out) > self.max_bytes:
                dout_text, wants_dout = "over max_bytes", False
            else:
                self.bytes += _nbytes(out)  # reserved now: the gradient comes later
            meta = {"layer": layer, "index": index, "q_shape": list(q.shape),
                    "k_shape": list(k.shape), "v_shape": list(v.shape),
                    "dtype": str(q.dtype).removeprefix("torch."),
                    "is_causal": bool(call["is_causal"]),
                    "scale": float(call["scale"]) if call["scale"] is not None
                    else 1.0 / math.sqrt(q.shape[-1]),
                    "dropout_p": float(call["dropout_p"]), "mask": mask_text,
                    "enable_gqa": bool(call["enable_gqa"]), "dout": dout_text}
            entry = {"meta": meta, "tensors": {"q": _cpu_copy(q), "k": _cpu_copy(k),
                                               "v": _cpu_copy(v)}}
            if keep_mask:
                entry["tensors"]["attn_mask"] = _cpu_copy(mask)
            self.calls.append(entry)
        if wants_dout:
            self._handles.append(out.register_hook(lambda grad: self._dout(entry, grad)))

    def _mask(self, mask) -> tuple[str, bool]:
        """``(metadata text, whether the mask is recorded)``; the caller holds the lock."""
        import torch

        if mask is None:
            return "none", False
        if type(mask) is not torch.Tensor or mask.is_nested or \
                str(mask.dtype).removeprefix("torch.") not in ITEM_BYTES:
            return f"unsupported mask ({type(mask).__name__} {getattr(mask, 'dtype', '')})", False
        if self.bytes + _nbytes(mask) > self.max_bytes:
            return "unsupported mask (over max_bytes)", False
        return "tensor", True

    def _dout(self, entry: dict, grad) -> None:
        with self._lock:
            if self._open and "dout" not in entry["tensors"]:  # a second backward: the first
                entry["tensors"]["dout"] = _cpu_copy(grad)
                entry["meta"]["dout"] = "yes"

    def _skip(self, why: str) -> None:
        with self._lock:
            self.seen += 1
            self._skip_locked(why)

    def _skip_locked(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

    # -- the file ---------------------------------------------------------------------------
    def write(self) -> None:
        calls = [c["meta"] for c in self.calls]
        tensors = {tensor_name(i, part): t for i, c in enumerate(self.calls)
                   for part, t in c["tensors"].items()}
        try:
            if default_suffix_is_torch(self.path):
                self._write_torch(tensors, calls)
            else:
                entries = {name: (str(t.dtype).removeprefix("torch."), tuple(t.shape),
                                  _nbytes(t)) for name, t in tensors.items()}
                write_safetensors(self.path, entries, metadata_for(calls),
                                  lambda name, fh: fh.write(_raw_bytes(tensors[name])))
        except OSError as exc:
            raise CaptureError(f"capture {os_error_text(exc, str(self.path))}") from None

    def _write_torch(self, tensors: dict, calls: list[dict]) -> None:
        import torch

        payload = {**tensors, METADATA: _torch_metadata(calls)}
        write_atomic(self.path, lambda fh: torch.save(payload, fh))

    def summary(self) -> str:
        douts = sum("dout" in c["tensors"] for c in self.calls)
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))
        return (f"{len(self.calls)} of {self.seen} attention calls recorded ({douts} with dout,"
                f" {self.bytes} bytes) in {self.path}" + (f"; skipped: {skipped}" if skipped
                                                          else ""))


def _torch_metadata(calls: list[dict]) -> str:
    """The fallback file's metadata: the same key/value strings as safetensors', as JSON."""
    import json

    return json.dumps(metadata_for(calls))


def _raw_bytes(tensor) -> memoryview:
    import torch

    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy())


def _wrapper(original, recorder: AttentionRecorder):
    import functools

    @functools.wraps(original)
    def scaled_dot_product_attention(*args, **kwargs):
        inside = getattr(recorder._local, "inside", False)
        if inside or not recorder._open:  # a call made by the call: the original's business
            return original(*args, **kwargs)
        recorder._local.inside = True
        try:
            out = original(*args, **kwargs)
            recorder.observe(args, kwargs, out)
        finally:
            recorder._local.inside = False
        return out

    scaled_dot_product_attention._attnbench_recorder = recorder
    return scaled_dot_product_attention


def capture_attention(path: Path | str, *, model=None, layers: Optional[Sequence[str]] = None,
                      max_calls: int = DEFAULT_MAX_CALLS,
                      max_bytes: int = DEFAULT_MAX_BYTES) -> AttentionRecorder:
    """A context manager recording attention calls into ``path`` (``.safetensors``, or
    torch.save's format for ``.pt``): see the module's docstring. Captures do not nest."""
    return AttentionRecorder(path, model, layers, max_calls, max_bytes)
