"""Single-device forward bugs: masks, alignment and bias layout. Backward is autograd's (or
the kernel's own) and consistent with the wrong forward, so the gradient identities hold: only
the fp64 reference (and NaN counts) can see these.
"""

from __future__ import annotations

from attnbench.backends.masks import dense_masks
from attnbench.backends.naive import NaiveBackend
from attnbench.backends.sdpa import SdpaDefault, SdpaBase, attention_mask
from attnbench.mutants.patch import mutated, rebound


def _megatron_mqa_masks(spec, batch, heads_q, sq, sk, dtype, device):
    """dense_masks as Megatron's MQA path used them: its scores are one bmm of all query heads
    with the single key head, rows ordered (query, head) -- [b, sq * np, sk] -- while the ALiBi
    tensor was built with rows ordered (head, query) -- [b, np * sq, sk] -- and added as is."""
    bias, visible, keep = dense_masks(spec, batch, heads_q, sq, sk, dtype, device)
    if bias is not None:
        as_built = bias.reshape(heads_q * sq, sk)                    # rows (head, query)
        bias = as_built.view(sq, heads_q, sk).transpose(0, 1)        # BUG: read as (query, head)
    return bias, visible, keep


class MqaAlibiOrder(NaiveBackend):
    """Catalogue 3 -- MQA with ALiBi whose bias is repeated in the wrong order (seed 004:
    bigcode Megatron-LM, "the alibi tensor is incorrectly being repeated ... [b, sq * np, sk]
    rather than [b, np * sq, sk]"). Only MQA + ALiBi takes the faulty path."""

    name = "mutant.mqa_alibi_order"
    supports_packed = False  # its faulty mask builder is dense

    def build_masks(self, spec, q, k):
        if k.shape[1] == 1 and spec.alibi_slopes is not None:
            batch, heads_q, sq, _ = q.shape
            return _megatron_mqa_masks(spec, batch, heads_q, sq, k.shape[2], q.dtype, q.device)
        return super().build_masks(spec, q, k)


class TopLeftCausal(SdpaDefault):
    """Catalogue 7 -- causal mask aligned top-left where bottom-right was meant (Sq != Sk).

    The sdpa backend with one condition dropped: it passes ``is_causal=True`` to
    scaled_dot_product_attention whenever the mask is causal (without ALiBi), but SDPA's
    is_causal is top-left aligned (pytorch/pytorch#108108; flash-attn switched to bottom-right
    in 2.1, Dao-AILab/flash-attention#517; NVIDIA/cutlass#2336). Identical when Sq == Sk.
    """

    name = "mutant.top_left_causal"
    _call = rebound(SdpaBase._call, attention_mask=mutated(
        attention_mask, "if diag == 0:", "if True:  # BUG: SDPA's is_causal is top-left aligned"))


class WindowOffByOne(NaiveBackend):
    """Catalogue 9 -- sliding window off by one: a window of W keys passed to a kernel whose
    left bound is inclusive as W instead of W - 1, so every row sees one key too many
    (huggingface/transformers#39408, zml/zml#763; vllm-project/vllm#3385 for the opposite
    direction)."""

    name = "mutant.window_off_by_one"

    def forward(self, q, k, v, spec):
        if spec.window_left >= 0:
            spec = spec.replace(window_left=spec.window_left + 1)  # BUG: W, not W - 1
        return super().forward(q, k, v, spec)


class MaskedRowNan(NaiveBackend):
    """Extra -- NaN for a query row that sees no key (causal with Sq > Sk, windows): softmax of
    a row of -inf is 0/0 (pytorch/pytorch#41508; NVIDIA-NeMo/Automodel#2826). flash-attn's
    convention, and this suite's, is an output of zeros."""

    name = "mutant.masked_row_nan"
    attend = mutated(NaiveBackend.attend, "scores = scores.masked_fill(~row_seen, 0.0)",
                     "pass  # BUG: fully masked rows keep their -inf scores")
