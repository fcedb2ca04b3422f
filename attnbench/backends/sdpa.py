"""``sdpa*``: PyTorch's scaled_dot_product_attention and its fused sub-backends.

``sdpa`` lets PyTorch choose; ``sdpa_math`` / ``sdpa_flash`` / ``sdpa_efficient`` /
``sdpa_cudnn`` pin one implementation with ``torch.nn.attention.sdpa_kernel``. GQA uses
``enable_gqa``. SDPA has no softcap, and its dropout mask is not exposed.

Masks, chosen so that SDPA stays on its fused kernels where it can (:func:`attention_mask`):
causal aligned top-left for this call (Sq == Sk, or a CP slice on the diagonal) is
``is_causal=True``; bottom-right causal with Sq != Sk is ``causal_lower_right`` (PyTorch's
``CausalBias``, which keeps the flash / efficient kernels; a dense mask would knock SDPA off
them); ALiBi and sliding windows need an explicit dense mask. Dense masks are built once per
case (:class:`attnbench.backends.masks.Prepared`), never inside a timed call, and no dropout
keep-mask is ever built: SDPA draws its own.

Packed (variable-length) cases go through PyTorch's jagged nested tensors
(``nested_tensor_from_jagged`` with the pack's ``cu_seqlens`` as offsets), one SDPA call for the
whole pack. The offsets are a device tensor built once per case (:class:`JaggedLayout`), handed
over with the shortest and longest lengths: without them every call copied the offsets from the
host and SDPA read the lengths back with ``.item()`` (a device sync inside the timed call;
torch/nested/_internal/nested_tensor.py ``_get_max_seqlen``). PyTorch supports there neither
``is_causal`` nor an ``attn_mask`` (so no causal, window or ALiBi:
torch/nested/_internal/sdpa.py) nor K/V heads shared by GQA groups, and a packed case's hidden
dropout mask cannot be read back by the probe (:mod:`attnbench.accuracy.dropout_probe` is
dense): those cases are ``unsupported``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnbench.backends.base import Forward, Unsupported
from attnbench.backends.masks import PreparesOnce, call_key, dense_masks
from attnbench.problem.packing import from_thd, to_thd
from attnbench.results.records import TENSORS


def attention_mask(spec, q: torch.Tensor, k: torch.Tensor):
    """(attn_mask, is_causal) for one SDPA call with these q (B, Hq, Sq, D), k (B, Hkv, Sk, D)."""
    batch, heads_q, sq, _ = q.shape
    sk = k.shape[2]
    if not spec.is_masked and spec.alibi_slopes is None:
        return None, False
    # Key position of this call's query 0, relative to this call's first key.
    diag = spec.q_start + spec.diagonal_offset - spec.kv_start
    if spec.is_causal and spec.alibi_slopes is None:
        if diag == 0:
            return None, True                        # SDPA's is_causal is top-left aligned
        if diag == sk - sq and sq <= sk:  # Sq > Sk: rows that see no key, NaN in CausalBias
            from torch.nn.attention.bias import causal_lower_right

            return causal_lower_right(sq, sk), False
    bias, visible, _ = dense_masks(spec, batch, heads_q, sq, sk, q.dtype, q.device, keep=False)
    if bias is None:
        return visible, False
    mask = bias if visible is None else bias.masked_fill(~visible, float("-inf"))
    return mask.unsqueeze(0), False  # (1, Hq, Sq, Sk): SDPA wants 2-D or 4-D masks


class SdpaBase(PreparesOnce):
    name = "sdpa"
    keep_mask = None  # hidden inside the kernel
    pinned: Optional[SDPBackend] = None
    needs_cuda = False

    supports_packed = True  # through jagged nested tensors, where PyTorch has the features

    def supports(self, case, device):
        if case.softcap:
            return "scaled_dot_product_attention has no softcap"
        if self.needs_cuda and device.type != "cuda":
            return f"{self.name} runs only on CUDA devices"
        if case.is_packed:
            return packed_limits(case)
        return None

    def input_precision(self, case, device):
        """Unpinned ``sdpa`` may fall back to the math kernel, which computes scores and P in the
        input dtype: judged like naive. Pinned fused kernels on a GPU accumulate in fp32."""
        return TENSORS if self.pinned in (None, SDPBackend.MATH) else ()

    def _call(self, q, k, v, spec):
        if spec.is_packed:
            layout = self.prepared.get(("jagged", spec.cu_seqlens_q, spec.cu_seqlens_kv,
                                        str(q.device)), lambda: JaggedLayout.of(spec, q.device))
            return _jagged_call(q, k, v, spec, layout)
        mask, is_causal = self.prepared.get(call_key(spec, q, k),
                                            lambda: attention_mask(spec, q, k))
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=spec.dropout_p, is_causal=is_causal,
            scale=spec.scale, enable_gqa=k.shape[1] != q.shape[1])

    def forward(self, q, k, v, spec):
        # Decode is forward only: no autograd state (it would be timed, and kept).
        q_in, k_in, v_in = (t.detach().requires_grad_(not spec.decode) for t in (q, k, v))
        try:
            with torch.set_grad_enabled(not spec.decode), self._pin():
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
            return contextlib.nullcontext()
        return sdpa_kernel([self.pinned])


def packed_limits(case) -> Optional[str]:
    """Why SDPA on jagged nested tensors cannot run packed ``case`` (None: it can)."""
    if case.mask != "none" or case.bias != "none":
        return ("PyTorch's SDPA on jagged nested tensors (packed cases) supports neither "
                "is_causal nor attn_mask: no causal, window or ALiBi")
    if case.heads_kv != case.heads_q:
        return ("PyTorch's SDPA on jagged nested tensors (packed cases) does not broadcast K/V "
                "heads (enable_gqa): MHA only")
    if case.dropout:
        return ("packed case with dropout: SDPA hides its mask and the probe that reads it back "
                "is for dense calls only")
    return None


@dataclass(frozen=True)
class JaggedLayout:
    """A pack's offsets as the jagged nested tensors take them, built once per case: int64 on
    the device, one tensor for K and V (and for Q too when its lengths are the keys': nested
    tensors with distinct offsets tensors have distinct ragged sizes), and each side's
    shortest and longest sequence."""

    offsets_q: torch.Tensor
    offsets_kv: torch.Tensor
    min_max_q: tuple[int, int]
    min_max_kv: tuple[int, int]

    @classmethod
    def of(cls, spec, device) -> "JaggedLayout":
        def lengths(cu):
            sizes = [b - a for a, b in zip(cu, cu[1:])]
            return min(sizes), max(sizes)

        offsets_kv = torch.tensor(spec.cu_seqlens_kv, dtype=torch.int64, device=device)
        offsets_q = offsets_kv if spec.cu_seqlens_q == spec.cu_seqlens_kv else \
            torch.tensor(spec.cu_seqlens_q, dtype=torch.int64, device=device)
        return cls(offsets_q, offsets_kv, lengths(spec.cu_seqlens_q),
                   lengths(spec.cu_seqlens_kv))


def _jagged_call(q, k, v, spec, layout: JaggedLayout):
    """One SDPA call on the whole pack: (1, H, T, D) -> jagged (N, H, j, D) by cu_seqlens, and
    the output back to (1, Hq, Tq, Dv). The (T, H, D) copies are part of the timed call, as
    they would not be for a user whose tensors are already (T, H, D)."""
    def jagged(x, offsets, min_max):
        return torch.nested.nested_tensor_from_jagged(
            to_thd(x), offsets, min_seqlen=min_max[0], max_seqlen=min_max[1]).transpose(1, 2)

    out = F.scaled_dot_product_attention(
        jagged(q, layout.offsets_q, layout.min_max_q),
        jagged(k, layout.offsets_kv, layout.min_max_kv),
        jagged(v, layout.offsets_kv, layout.min_max_kv), dropout_p=spec.dropout_p,
        scale=spec.scale, enable_gqa=k.shape[1] != q.shape[1])
    return from_thd(out.transpose(1, 2).values())


class SdpaDefault(SdpaBase):
    name = "sdpa"


class SdpaMath(SdpaBase):
    name = "sdpa_math"
    pinned = SDPBackend.MATH


class SdpaFlash(SdpaBase):
    name = "sdpa_flash"
    pinned = SDPBackend.FLASH_ATTENTION

    def input_precision(self, case, device):
        """PyTorch's CPU flash backward adds each query block's dK/dV straight into buffers of
        the input dtype (a GQA group's heads one after another), and rounds dQ once per
        512-key split: measured in bf16, dK/dV up to 3.3x the fused baseline's error at 512
        tokens, dQ 1.0x at 512 growing to 1.65x at 4096 -- matched to 0.1 % by an emulation of
        that accumulation. On the CPU, in half precision, the gradients are judged like naive;
        fp32 accumulates in fp32 anyway."""
        if device.type == "cuda" or case.dtype == "fp32":
            return ()
        return ("dq", "dk", "dv")


class SdpaEfficient(SdpaBase):
    name = "sdpa_efficient"
    pinned = SDPBackend.EFFICIENT_ATTENTION
    needs_cuda = True


class SdpaCudnn(SdpaBase):
    name = "sdpa_cudnn"
    pinned = SDPBackend.CUDNN_ATTENTION
    needs_cuda = True
