"""``sdpa*``: PyTorch's scaled_dot_product_attention and its fused sub-backends.

``sdpa`` lets PyTorch choose; ``sdpa_math`` / ``sdpa_flash`` / ``sdpa_efficient`` /
``sdpa_cudnn`` pin one implementation with ``torch.nn.attention.sdpa_kernel``. ALiBi, windows
and bottom-right causal masks are passed as an explicit mask (SDPA's ``is_causal`` is top-left
aligned, so it is used only when Sq == Sk). GQA uses ``enable_gqa``. SDPA has no softcap, and its
dropout mask is not exposed: with dropout the reference-free identities decide.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnbench.backends.base import Forward, Unsupported
from attnbench.backends.naive import dense_masks


class _Sdpa:
    name = "sdpa"
    keep_mask = None  # hidden inside the kernel
    pinned: Optional[SDPBackend] = None
    needs_cuda = False

    def supports(self, case, device):
        if case.softcap:
            return "scaled_dot_product_attention has no softcap"
        if self.needs_cuda and device.type != "cuda":
            return f"{self.name} runs only on CUDA devices"
        return None

    def _call(self, q, k, v, spec):
        batch, heads_q, sq, _ = q.shape
        sk = k.shape[2]
        bias, visible, _ = dense_masks(spec, batch, heads_q, sq, sk, q.dtype, q.device)
        is_causal = spec.is_causal and sq == sk and spec.seqlen_q_total == spec.seqlen_kv_total \
            and spec.q_start == spec.kv_start and bias is None
        mask = None
        if not is_causal and (visible is not None or bias is not None):
            if bias is None:
                mask = visible
            else:
                mask = bias if visible is None else bias.masked_fill(~visible, float("-inf"))
                mask = mask.unsqueeze(0)  # (1, Hq, Sq, Sk): SDPA wants 2-D or 4-D masks
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=spec.dropout_p, is_causal=is_causal,
            scale=spec.scale, enable_gqa=k.shape[1] != heads_q)

    def forward(self, q, k, v, spec):
        q_in, k_in, v_in = (t.detach().requires_grad_(True) for t in (q, k, v))
        try:
            with torch.enable_grad(), self._pin():
                out = self._call(q_in, k_in, v_in, spec)
        except RuntimeError as exc:
            text = str(exc)
            if "No available kernel" in text or "No viable backend" in text:
                raise Unsupported(f"{self.name}: PyTorch has no kernel for this case on "
                                  f"{q.device.type} ({text.splitlines()[0][:120]})") from None
            raise
        return Forward(out=out.detach(), lse=None, ctx=(out, q_in, k_in, v_in))

    def backward(self, ctx, dout):
        out, q_in, k_in, v_in = ctx
        with self._pin():
            return torch.autograd.grad(out, (q_in, k_in, v_in), dout, retain_graph=True)

    def _pin(self):
        if self.pinned is None:
            import contextlib

            return contextlib.nullcontext()
        return sdpa_kernel([self.pinned])


class SdpaDefault(_Sdpa):
    name = "sdpa"


class SdpaMath(_Sdpa):
    name = "sdpa_math"
    pinned = SDPBackend.MATH


class SdpaFlash(_Sdpa):
    name = "sdpa_flash"
    pinned = SDPBackend.FLASH_ATTENTION


class SdpaEfficient(_Sdpa):
    name = "sdpa_efficient"
    pinned = SDPBackend.EFFICIENT_ATTENTION
    needs_cuda = True


class SdpaCudnn(_Sdpa):
    name = "sdpa_cudnn"
    pinned = SDPBackend.CUDNN_ATTENTION
    needs_cuda = True
