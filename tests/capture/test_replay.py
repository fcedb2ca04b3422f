"""A captured call as a case: the fields it fixes, what it cannot be, and a digest that
refuses a changed file."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnbench.capture.loader import read_index
from attnbench.capture.recorder import capture_attention
from attnbench.capture.replay import (contradictions, file_digest, replay_fields,
                                      replay_tensors)
from attnbench.errors import CaptureError
from capture_model import TinyModel, train_step


def _capture(path, *calls) -> None:
    """Each call: (q, k, v, sdpa keyword arguments)."""
    with capture_attention(path):
        for q, k, v, kwargs in calls:
            F.scaled_dot_product_attention(q, k, v, **kwargs)


def test_a_models_call_fixes_the_case_fields(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "a.safetensors"
    with capture_attention(path):
        train_step(TinyModel())
    fields = replay_fields(read_index(path), 1)
    assert fields == {"batch": 2, "seqlen_q": 16, "seqlen_kv": 16, "heads_q": 4, "heads_kv": 4,
                      "head_dim": 8, "head_dim_v": 8, "mask": "causal", "dtype": "fp32"}
    assert contradictions(fields, {"batch": 2, "heads_q": 8, "seed": 3}) == [
        "heads_q: the sweep says 8, the capture 4"]


def test_gqa_and_a_value_head_dim_of_its_own(tmp_path):
    q, k, v = torch.randn(1, 8, 5, 16), torch.randn(1, 2, 7, 16), torch.randn(1, 2, 7, 12)
    _capture(tmp_path / "a.safetensors", (q, k, v, {"enable_gqa": True}))
    fields = replay_fields(read_index(tmp_path / "a.safetensors"), 0)
    assert (fields["heads_kv"], fields["seqlen_kv"], fields["head_dim_v"]) == (2, 7, 12)


@pytest.mark.parametrize("q_shape, k_shape, kwargs, message", [
    ((1, 2, 8, 8), (1, 2, 8, 8), {"scale": 0.5}, r"scale 0.5 \(expected 1/sqrt\(head_dim\)"),
    ((1, 2, 8, 8), (1, 2, 8, 8), {"attn_mask": torch.ones(8, 8, dtype=torch.bool)},
     r"mask tensor \(expected a call without attn_mask"),
    ((1, 2, 4, 8), (1, 2, 8, 8), {"is_causal": True}, r"is_causal with 4 queries and 8 keys"),
    ((2, 8, 8), (2, 8, 8), {}, r"q, k, v of 3 dimensions"),
])
def test_what_a_case_cannot_express_is_refused_in_one_line(tmp_path, q_shape, k_shape, kwargs,
                                                            message):
    q, k = torch.randn(q_shape), torch.randn(k_shape)
    path = tmp_path / "a.safetensors"
    _capture(path, (q, k, k, kwargs))
    with pytest.raises(CaptureError, match=message) as info:
        replay_fields(read_index(path), 0)
    assert str(info.value).startswith(f"capture {path}:0: ")
    with pytest.raises(CaptureError, match=r"no such call \(expected 0..0\)"):
        replay_fields(read_index(path), 1)


def test_fp64_is_not_a_case_dtype(tmp_path):
    q = torch.randn(1, 1, 4, 4, dtype=torch.float64)
    _capture(tmp_path / "a.safetensors", (q, q, q, {}))
    with pytest.raises(CaptureError, match=r"dtype float64 \(expected one of float32"):
        replay_fields(read_index(tmp_path / "a.safetensors"), 0)


def test_the_digest_names_the_content_and_refuses_a_changed_file(tmp_path):
    path = tmp_path / "a.safetensors"
    q = torch.randn(1, 2, 8, 4, requires_grad=True)
    with capture_attention(path):
        F.scaled_dot_product_attention(q, q, q).sum().backward()
    digest = file_digest(path)
    got_q, _, _, dout = replay_tensors(path, 0, digest)
    assert torch.equal(got_q, q.detach()) and torch.equal(dout, torch.ones(1, 2, 8, 4))
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # one bit of dout: the margin
    path.write_bytes(bytes(data))
    assert file_digest(path) != digest
    with pytest.raises(CaptureError, match=rf"its digest is \w+ \(expected {digest}: the file "
                                           "changed"):
        replay_tensors(path, 0, digest)
