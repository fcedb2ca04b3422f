"""Stand-ins for flash-attn 2, FlashAttention-3, TransformerEngine and xformers, for CPU tests.

Each has the installed package's signature (no ``**kwargs``: a name the real function does
not take fails here as it would there), asserts what the real one asserts about its arguments
(dtype, strides, layout by name, head dims, window pairs, descale names and shapes, bias
alignment), records how it was called, and computes attention from its *documented* semantics,
not from attnbench's code: query i sees key j iff ``-left <= j - (i + offset) <= right``, with
``offset = Sk - Sq`` (bottom-right) or 0 (top-left, TE's ``causal`` and its FusedAttention
sliding window before 2.12), ALiBi ``-slope * |i + offset - j|``, softcap ``c * tanh(s / c)``.
What was read, where: csrc/flash_attn/flash_api.cpp and flash_attn/flash_attn_interface.py
(v2.5.9, v2.6.0, v2.8.3), hopper/flash_api.cpp and hopper/flash_attn_interface.py (bdf733be,
7a80279, main), transformer_engine/pytorch/attention/dot_product_attention (v2.11, v2.12),
xformers/ops/fmha/cutlass.py (``_check_bias_alignment``).

Legend: B = batch, S = length, H = heads, D / Dv = head dims; tensors (B, S, H, D) as the
libraries take them.
"""

from __future__ import annotations

import sys
import types
import warnings
import torch

HALF = (torch.float16, torch.bfloat16)


def attend(q, k, v, *, scale, offset, left=-1, right=-1, softcap=0.0, slopes=None):
    """Exact attention by the libraries' documented rule, (B, Sq, Hq, D) -> (out in q's dtype
    (B, Sq, Hq, Dv), lse float32 (B, Hq, Sq)); differentiable. A row that sees no key: 0."""
    group = q.shape[2] // k.shape[2]
    qd = q.double()
    kd, vd = (x.double().repeat_interleave(group, dim=2) for x in (k, v))
    s = torch.einsum("bihd,bjhd->bhij", qd, kd) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    rel = torch.arange(k.shape[1])[None, :] - (torch.arange(q.shape[1])[:, None] + offset)
    if slopes is not None:
        s = s - slopes.double().reshape(-1, q.shape[2])[:, :, None, None] * rel.abs()
    visible = torch.ones_like(rel, dtype=torch.bool)
    if right >= 0:
        visible &= rel <= right
    if left >= 0:
        visible &= rel >= -left
    s = s.masked_fill(~visible, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    out = torch.einsum("bhij,bjhd->bihd", p, vd)
    return out.to(q.dtype), torch.logsumexp(s, -1).float()


def install(monkeypatch, name: str, **attrs) -> types.ModuleType:
    """A module ``name`` (and its parents) in sys.modules holding ``attrs``."""
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    parent, _, child = name.rpartition(".")
    if parent:
        holder = sys.modules.get(parent) or install(monkeypatch, parent)
        monkeypatch.setattr(holder, child, module, raising=False)
    return module


# -- flash-attn 2 --------------------------------------------------------------------------------


def _fa2_checks(q, k, v, softcap, dropout_p, alibi_slopes):
    """mha_fwd's TORCH_CHECKs (flash_api.cpp)."""
    assert q.dtype in HALF, "FlashAttention only support fp16 and bf16 data type"
    assert k.dtype == q.dtype == v.dtype, "query and key must have the same dtype"
    assert all(x.stride(-1) == 1 for x in (q, k, v)), \
        "Input tensor must have contiguous last dimension"
    assert q.shape[-1] <= 256, "FlashAttention forward only supports head dimension at most 256"
    assert v.shape[-1] == q.shape[-1], "v must have shape (batch_size, seqlen_k, num_heads_k, " \
        "head_size)"  # CHECK_SHAPE(v, ..., head_size)
    assert q.shape[-2] % k.shape[-2] == 0, \
        "Number of heads in key/value must divide number of heads in query"
    if softcap > 0 and dropout_p > 0:
        raise RuntimeError("Softcapping does not support dropout for now")
    if alibi_slopes is not None:
        assert alibi_slopes.dtype == torch.float32, "ALiBi slopes must have dtype fp32"


def fa2_no_key_lse(lse):
    """FA2's lse for a row that sees no key is +inf (softmax.h: ``sum == 0 ? INFINITY``)."""
    return lse.masked_fill(lse == float("-inf"), float("inf"))


def fake_flash_attn(monkeypatch, version: str = "2.8.3") -> list[dict]:
    """flash_attn at ``version`` ("2.5.9": the signatures before softcap); returns its calls."""
    calls: list[dict] = []

    def core(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes):
        _fa2_checks(q, k, v, softcap, dropout_p, alibi_slopes)
        left, right = window_size
        calls.append({"fn": "flash_attn_func", "causal": causal, "window_size": window_size,
                      "softcap": softcap, "alibi_slopes": alibi_slopes, "q": q, "k": k})
        out, lse = attend(q, k, v, scale=softmax_scale, offset=k.shape[1] - q.shape[1],
                          left=left, right=0 if causal else right, softcap=softcap,
                          slopes=alibi_slopes)
        return out, fa2_no_key_lse(lse)

    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                        window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                        deterministic=False, return_attn_probs=False):
        out, lse = core(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                        alibi_slopes)
        return (out, lse, None) if return_attn_probs else out

    def flash_attn_func_2_5(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                            window_size=(-1, -1), alibi_slopes=None, deterministic=False,
                            return_attn_probs=False):
        out, lse = core(q, k, v, dropout_p, softmax_scale, causal, window_size, 0.0,
                        alibi_slopes)
        return (out, lse, None) if return_attn_probs else out

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               dropout_p=0.0, softmax_scale=None, causal=False,
                               window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                               deterministic=False, return_attn_probs=False, block_table=None):
        assert cu_seqlens_q.dtype == torch.int32, "cu_seqlens_q must have dtype int32"
        outs, lses = [], []
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        for b in range(len(cq) - 1):
            out, lse = core(q[None, cq[b]:cq[b + 1]], k[None, ck[b]:ck[b + 1]],
                            v[None, ck[b]:ck[b + 1]], dropout_p, softmax_scale, causal,
                            window_size, softcap, alibi_slopes)
            outs.append(out[0])
            lses.append(lse[0])
        out, lse = torch.cat(outs), torch.cat(lses, dim=1)  # (T, H, D), (H, T)
        return (out, lse, None) if return_attn_probs else out

    def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                                rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                                cache_leftpad=None, block_table=None, softmax_scale=None,
                                causal=False, window_size=(-1, -1), softcap=0.0,
                                rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                                return_softmax_lse=False):
        _fa2_checks(q, k_cache, v_cache, softcap, 0.0, alibi_slopes)
        batch, sq, heads_q, _ = q.shape
        heads_kv = k_cache.shape[2]
        left, right = window_size
        # mha_fwd_kvcache: "causal=true is the same as causal=false in this case"
        is_causal = causal and not (sq == 1 and alibi_slopes is None)
        if is_causal:
            right = 0
        swapped = (sq == 1 and heads_q > heads_kv and left < 0 and right < 0
                   and alibi_slopes is None)
        calls.append({"fn": "flash_attn_with_kvcache", "causal": causal,
                      "window_size": window_size, "swapped": swapped})
        outs, lses = [], []
        for b in range(batch):
            length = int(cache_seqlens[b])
            if block_table is None:
                keys, values = k_cache[b, :length], v_cache[b, :length]
            else:
                pages = block_table[b].long()
                keys = k_cache[pages].flatten(0, 1)[:length]
                values = v_cache[pages].flatten(0, 1)[:length]
            out, lse = attend(q[b:b + 1], keys[None], values[None], scale=softmax_scale,
                              offset=length - sq, left=left, right=0 if causal else right,
                              softcap=softcap, slopes=alibi_slopes)
            outs.append(out)
            lses.append(lse)
        out, lse = torch.cat(outs), fa2_no_key_lse(torch.cat(lses))
        return (out, lse) if return_softmax_lse else out

    flash_attn_func_2_5.__name__ = "flash_attn_func"
    if version.startswith("2.5"):
        install(monkeypatch, "flash_attn", __version__=version,
                flash_attn_func=flash_attn_func_2_5)
    else:
        install(monkeypatch, "flash_attn", __version__=version, flash_attn_func=flash_attn_func,
                flash_attn_varlen_func=flash_attn_varlen_func,
                flash_attn_with_kvcache=flash_attn_with_kvcache)
    return calls


# -- FlashAttention-3 ----------------------------------------------------------------------------


def fake_flash_attn3(monkeypatch, old_names: bool = False) -> list[dict]:
    """flash_attn_interface: today's ``q_descale`` signature, or (``old_names``) the one of
    2024-10 (a5a75274) with ``descale_q`` and no softcap."""
    calls: list[dict] = []

    def checks(q, k, v, descales):
        fp8 = q.dtype == torch.float8_e4m3fn
        assert q.dtype in HALF + (torch.float8_e4m3fn,), \
            "FlashAttention only supports fp16, bf16, and fp8_e4m3 data type"
        alignment = 16 if fp8 else 8
        assert q.shape[-1] % alignment == 0, f"head_size should be a multiple of {alignment}"
        assert v.shape[-1] % alignment == 0, f"head_size_v should be a multiple of {alignment}"
        for d in descales:
            if d is not None:
                assert d.shape == (q.shape[0], k.shape[2]), \
                    "q_descale must have shape (batch_size, num_heads_k)"

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None,
                        k_descale=None, v_descale=None, window_size=(-1, -1),
                        attention_chunk=0, softcap=0.0, num_splits=1, pack_gqa=None,
                        deterministic=False, sm_margin=0, return_attn_probs=False):
        checks(q, k, v, (q_descale, k_descale, v_descale))
        calls.append({"causal": causal, "window_size": window_size, "k": k})
        if q.dtype == torch.float8_e4m3fn:
            group = q.shape[2] // k.shape[2]
            q, k, v = (x.float() * d.repeat_interleave(g, 1)[:, None, :, None]
                       for x, d, g in ((q, q_descale, group), (k, k_descale, 1),
                                       (v, v_descale, 1)))
        left, right = window_size
        out, lse = attend(q, k, v, scale=softmax_scale, offset=k.shape[1] - q.shape[1],
                          left=left, right=0 if causal else right, softcap=softcap)
        return out.to(torch.bfloat16) if out.dtype == torch.float32 else out, lse

    def flash_attn_func_old(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1),
                            deterministic=False, descale_q=None, descale_k=None, descale_v=None,
                            gqa_parallel=False):
        raise AssertionError("the adapter must refuse this release before calling it")

    install(monkeypatch, "flash_attn_interface",
            flash_attn_func=flash_attn_func_old if old_names else flash_attn_func)
    return calls


# -- TransformerEngine ---------------------------------------------------------------------------


def check_set_window_size(attn_mask_type: str, window_size):
    """TE 2.11's dpa_utils.check_set_window_size, as it is (warns and changes, or asserts)."""
    orig = window_size
    if "causal" in attn_mask_type:
        if orig is None:
            return (-1, 0)
        if orig == (-1, -1) or (orig[0] >= 0 and orig[1] != 0):
            warnings.warn("window_size should be (-1, 0) or (>=0, 0) for " + attn_mask_type)
            return (orig[0], 0)
        assert orig == (-1, 0) or not (orig[0] < 0 or orig[1] != 0), \
            "window_size should be (-1, 0) or (>=0, 0) for attn_mask_type=" + attn_mask_type
        return orig
    assert attn_mask_type in ("no_mask", "padding", "arbitrary"), attn_mask_type
    if orig is None:
        return (-1, -1)
    if orig == (-1, 0):
        warnings.warn("window_size should be (-1, -1) or (>=0, >=0) for " + attn_mask_type)
        return (-1, -1)
    assert orig == (-1, -1) or not (orig[0] < 0 or orig[1] < 0), \
        "window_size should be (-1, -1) or (>=0, >=0) for attn_mask_type=" + attn_mask_type
    return orig


def fake_transformer_engine(monkeypatch, version: str = "2.11.0") -> list[dict]:
    calls: list[dict] = []

    class DotProductAttention:
        def __init__(self, num_attention_heads, kv_channels, num_gqa_groups=None,
                     attention_dropout=0.0, qkv_format="sbhd", attn_mask_type="causal",
                     window_size=None, sequence_parallel=False, tp_size=1,
                     get_rng_state_tracker=None, tp_group=None, layer_number=None,
                     attention_type="self", cp_group=None, cp_global_ranks=None,
                     cp_stream=None, softmax_scale=None):
            self.heads, self.groups = num_attention_heads, num_gqa_groups
            self.kv_channels = (kv_channels if isinstance(kv_channels, tuple)
                                else (kv_channels, kv_channels))
            self.qkv_format, self.mask = qkv_format, attn_mask_type
            self.window = check_set_window_size(attn_mask_type, window_size)
            self.scale = softmax_scale

        def to(self, device):
            return self

        def __call__(self, *args, **kwargs):
            return self.forward(*args, **kwargs)

        def forward(self, query_layer, key_layer, value_layer, attention_mask=None,
                    qkv_format=None, cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None,
                    max_seqlen_kv=None, attn_mask_type=None, window_size=None,
                    checkpoint_core_attention=False, core_attention_bias_type="no_bias",
                    core_attention_bias=None, alibi_slopes=None, fast_zero_fill=True,
                    inference_params=None):
            q, k, v = query_layer, key_layer, value_layer
            assert self.qkv_format == "bshd"
            # get_qkv_layout names the layout "bshd_bshd_bshd" and the cuDNN path reads the
            # tensors by that name: anything but contiguous (B, S, H, D) is misread.
            assert all(x.is_contiguous() for x in (q, k, v)), \
                "TE reads bshd_bshd_bshd by name: q, k, v must be contiguous (B, S, H, D)"
            assert q.shape[-1] == self.kv_channels[0] and v.shape[-1] == self.kv_channels[1], \
                "head_dim_qk / head_dim_v must match kv_channels"
            assert q.shape[2] == self.heads and k.shape[2] == (self.groups or self.heads)
            sq, sk = q.shape[1], k.shape[1]
            left, right = self.window
            if self.mask == "causal":
                offset = 0  # top-left
            elif self.mask == "causal_bottom_right":
                offset = sk - sq
            elif right == 0 and left >= 0:
                offset = 0  # FusedAttention's sliding window before 2.12: top-left
            else:
                offset = sk - sq  # FlashAttention / unfused: bottom-right
            slopes = alibi_slopes if core_attention_bias_type == "alibi" else None
            calls.append({"mask": self.mask, "window": self.window, "q": q, "k": k,
                          "kv_channels": self.kv_channels})
            out, _ = attend(q, k, v, scale=self.scale, offset=offset, left=left, right=right,
                            slopes=slopes)
            return out.reshape(out.shape[0], sq, -1)  # (B, Sq, H * Dv)

    install(monkeypatch, "transformer_engine.pytorch", DotProductAttention=DotProductAttention)
    sys.modules["transformer_engine"].__version__ = version
    return calls


# -- xformers ------------------------------------------------------------------------------------


class LowerTriangularFromBottomRightMask:
    pass


def fake_xformers(monkeypatch) -> list[dict]:
    calls: list[dict] = []

    def memory_efficient_attention(query, key, value, attn_bias=None, p=0.0, scale=None, *,
                                   op=None, output_dtype=None):
        if isinstance(attn_bias, torch.Tensor):  # cutlass.py _check_bias_alignment
            alignment = 128 // torch.finfo(attn_bias.dtype).bits
            for d in range(attn_bias.ndim - 1):
                assert attn_bias.stride(d) % alignment == 0, \
                    f"attn_bias.stride(-2) % {alignment} != 0 ({attn_bias.stride()})"
            assert attn_bias.stride(-1) <= 1, "you should call `.contiguous()` on the bias"
        calls.append({"attn_bias": attn_bias})
        sq, sk = query.shape[1], key.shape[1]
        if not isinstance(attn_bias, torch.Tensor):
            bottom_right = isinstance(attn_bias, LowerTriangularFromBottomRightMask)
            return attend(query, key, value, scale=scale, offset=sk - sq,
                          right=0 if bottom_right else -1)[0]
        s = torch.einsum("bihd,bjhd->bhij", query.double(), key.double()) * scale
        p = torch.softmax(s + attn_bias.double(), -1).nan_to_num(0.0)
        return torch.einsum("bhij,bjhd->bihd", p, value.double()).to(query.dtype)

    ops = install(monkeypatch, "xformers.ops",
                  memory_efficient_attention=memory_efficient_attention)
    ops.fmha = types.SimpleNamespace(attn_bias=types.SimpleNamespace(
        LowerTriangularFromBottomRightMask=LowerTriangularFromBottomRightMask))
    return calls
