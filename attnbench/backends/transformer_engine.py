"""``transformer_engine``: TransformerEngine's ``DotProductAttention`` (``qkv_format="bshd"``).

Legend: B = batch, Hq / Hkv = heads, Sq / Sk = lengths, D / Dv = head dims.

What TE takes, read in its sources (transformer_engine/pytorch/attention/dot_product_attention,
v2.11 and v2.12):

* **Layout by name.** ``get_qkv_layout`` names the layout from pointers, shapes and strides
  (``bshd_bshd_bshd``), and the cuDNN path (FusedAttention) then reads the tensors by that name,
  not by their strides: a (B, S, H, D) transpose of attnbench's (B, H, S, D) is read as if it
  were contiguous. q, k, v are handed over as contiguous (B, S, H, D) copies, made once per
  case (never inside a timed call) and used as the leaves of the autograd graph; the output
  comes back as (B, Sq, Hq * Dv) and dout is handed back in that layout (one copy per case).
* **Masks.** ``causal`` is aligned top-left, ``causal_bottom_right`` bottom-right; TE <= 2.11
  aligns a sliding window of ``no_mask`` top-left in FusedAttention, and accepts only the
  windows (-1, -1), (-1, 0) and (>= 0, >= 0) (``check_set_window_size`` asserts otherwise).
  attnbench's masks are bottom-right, so: causal -> ``causal_bottom_right``; a causal window
  (W, 0) -> ``causal_bottom_right`` with ``window_size=(W, 0)``; a two-sided window (L, R) ->
  ``no_mask`` with (L, R) (FusedAttention declines it before 2.12, FlashAttention and the
  unfused path align it bottom-right); a one-sided window (L, -1) or (-1, R > 0) is refused.
* **Head dims.** ``kv_channels=(D, Dv)`` when they differ (a pair since TE 1.10).
* **Global offsets** (all-gather CP) through :func:`attnbench.backends.call_window.local_window`,
  as flash-attn: keys no query sees are cut off and the window moved to the call's corner.

Not run here (no GPU, package absent): written against those sources and checked with a
stand-in that asserts what they assert (tests/backends/test_adapters_upstream.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from attnbench.backends.adapters import _alibi_slopes
from attnbench.backends.base import Forward, Unsupported
from attnbench.backends.call_window import CallWindow, local_window
from attnbench.backends.masks import PreparesOnce, call_key
from attnbench.backends.upstream import lacking, older_than, unavailable, version_of

TE = "transformer_engine.pytorch"
KV_CHANNELS_PAIR_SINCE = "1.10"
"""The first TE whose ``DotProductAttention`` takes ``kv_channels=(D, Dv)`` (read at v1.10)."""


def te_mask(left: int, right: int) -> tuple[str, Optional[tuple[int, int]]]:
    """(attn_mask_type, window_size) of a bottom-right window (left, right); raises
    :class:`Unsupported` for the one-sided windows TE does not take."""
    if left < 0 and right < 0:
        return "no_mask", None
    if left < 0 and right == 0:
        return "causal_bottom_right", None
    if left >= 0 and right == 0:
        return "causal_bottom_right", (left, 0)
    if left >= 0 and right >= 0:
        return "no_mask", (left, right)
    raise Unsupported(one_sided(left, right))


def one_sided(left: int, right: int) -> str:
    return (f"transformer_engine takes the windows (-1, -1), (-1, 0) and (>=0, >=0) only "
            f"(check_set_window_size), not the one-sided ({left}, {right})")


@dataclass(frozen=True)
class _Call:
    """One call's module, keywords and inputs, built once per (spec, shapes, input tensors)."""

    module: Any
    kwargs: dict
    window: CallWindow
    sources: tuple
    """The caller's q, k, v: held so that their ids, part of the key, stay theirs."""
    inputs: tuple
    """Contiguous (B, S, H, D) copies of q and of the keys the call passes: the graph's
    leaves."""


@dataclass(frozen=True)
class _Context:
    out: torch.Tensor
    """(B, Sq, Hq * Dv), TE's own output."""
    inputs: tuple
    keys: Optional[tuple[int, int]]
    seqlen_kv: int


def _identity(*tensors: torch.Tensor) -> tuple:
    """Which tensors these are now: an in-place change bumps ``_version``."""
    return tuple((id(t), t._version) for t in tensors)


class TransformerEngineBackend(PreparesOnce):
    name = "transformer_engine"
    keep_mask = None

    def __init__(self):
        self._modules: dict = {}

    def supports(self, case, device):
        if device.type != "cuda":
            return "transformer_engine runs only on CUDA devices"
        if case.softcap:
            return "transformer_engine DotProductAttention has no softcap"
        left, right = case.window_bounds
        if (left >= 0 > right) or (left < 0 < right):
            return one_sided(left, right)
        return unavailable(TE) or te_release(case)

    def forward(self, q, k, v, spec):
        call = self.prepared.get(("call", call_key(spec, q, k), *_identity(q, k, v)),
                                 lambda: self._call(q, k, v, spec))
        with torch.enable_grad():
            out = call.module(*call.inputs, **call.kwargs)  # (B, Sq, Hq * Dv)
        view = out.view(q.shape[0], q.shape[2], q.shape[1], -1).transpose(1, 2)
        return Forward(out=view.detach(), lse=None,
                       ctx=_Context(out, call.inputs, call.window.keys, k.shape[2]))

    def backward(self, ctx: _Context, dout):
        _, grad_out = self.prepared.get(("dout", *_identity(dout)), lambda: (
            dout, dout.transpose(1, 2).reshape(ctx.out.shape).contiguous()))
        dq, dk, dv = torch.autograd.grad(ctx.out, ctx.inputs, grad_out, retain_graph=True)
        return dq.transpose(1, 2), _uncut(dk, ctx), _uncut(dv, ctx)

    def _call(self, q, k, v, spec) -> _Call:
        import transformer_engine.pytorch as te

        window = local_window(spec, q.shape[2], k.shape[2], library="transformer_engine",
                              alibi=spec.alibi_slopes is not None)
        mask, window_size = te_mask(window.left, window.right)
        head_dim, head_dim_v = q.shape[-1], v.shape[-1]
        key = (q.shape[1], k.shape[1], head_dim, head_dim_v, spec.dropout_p, mask, window_size,
               spec.scale, str(q.device))
        if key not in self._modules:
            self._modules[key] = te.DotProductAttention(
                q.shape[1], head_dim if head_dim == head_dim_v else (head_dim, head_dim_v),
                num_gqa_groups=k.shape[1], attention_dropout=spec.dropout_p,
                qkv_format="bshd", attn_mask_type=mask, window_size=window_size,
                softmax_scale=spec.scale).to(q.device)
        kwargs = {}
        if spec.alibi_slopes is not None:
            kwargs = {"core_attention_bias_type": "alibi", "alibi_slopes": _alibi_slopes(spec, q)}
        first, end = window.keys or (0, k.shape[2])
        inputs = tuple(x.detach().transpose(1, 2).contiguous().requires_grad_(True)
                       for x in (q, k[:, :, first:end], v[:, :, first:end]))
        return _Call(self._modules[key], kwargs, window, (q, k, v), inputs)


def _uncut(grad: torch.Tensor, ctx: _Context) -> torch.Tensor:
    """dK or dV (B, Sk', Hkv, *) of the keys the call passed, as (B, Hkv, Sk, *): zero for the
    keys it cut off (no query saw them)."""
    grad = grad.transpose(1, 2)
    if ctx.keys is None:
        return grad
    full = grad.new_zeros(*grad.shape[:2], ctx.seqlen_kv, grad.shape[-1])
    full[:, :, ctx.keys[0]:ctx.keys[1]] = grad
    return full


def te_release(case) -> Optional[str]:
    """Why the installed TransformerEngine cannot take what ``case`` needs (its version in the
    reason), or None."""
    import transformer_engine.pytorch as te

    if case.head_dim_v != case.head_dim and older_than(TE, KV_CHANNELS_PAIR_SINCE):
        return (f"{version_of(TE)}: DotProductAttention takes one head size (kv_channels "
                f"(D, Dv) since {KV_CHANNELS_PAIR_SINCE}); head_dim_v {case.head_dim_v} != "
                f"head_dim {case.head_dim}")
    names = ["softmax_scale"] + (["window_size"] if case.mask == "window" else [])
    reason = lacking(TE, te.DotProductAttention, names)
    if reason or case.bias != "alibi":
        return reason
    return lacking(TE, te.DotProductAttention.forward,
                   ["core_attention_bias_type", "alibi_slopes"])
