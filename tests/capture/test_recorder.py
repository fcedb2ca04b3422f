"""capture_attention records what a model's attention calls saw, bit for bit, within its bounds,
and leaves torch as it found it."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnbench.capture.loader import load_capture, read_index
from attnbench.capture.recorder import capture_attention
from attnbench.errors import CaptureError
from capture_model import TinyModel, train_step


@pytest.fixture
def model():
    torch.manual_seed(0)
    return TinyModel()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_the_file_holds_what_each_layer_saw_bit_for_bit(tmp_path, model, dtype, suffix):
    model = model.to(dtype)
    path = tmp_path / f"acts{suffix}"
    with capture_attention(path) as cap:
        train_step(model, dtype=dtype)
    calls = load_capture(path)
    assert [c.meta["layer"] for c in calls] == ["blocks.0.attn", "blocks.1.attn"]
    for call, block in zip(calls, model.blocks):
        seen = block.attn.seen[-1]
        assert set(call.tensors) == {"q", "k", "v", "dout"}
        bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
        for part in ("q", "k", "v", "dout"):
            assert call.tensors[part].dtype == dtype
            # bitwise: the same bytes (a NaN or -0.0 would fail a comparison of values)
            assert torch.equal(call.tensors[part].view(bits),
                               seen[part].contiguous().view(bits)), part
        meta = call.meta
        assert meta["is_causal"] is True and meta["dout"] == "yes" and meta["mask"] == "none"
        assert meta["scale"] == pytest.approx(1 / math.sqrt(8))
        assert meta["q_shape"] == [2, 4, 16, 8] and meta["dtype"] == str(dtype)[6:]
    assert read_index(path).format == ("torch.save" if suffix == ".pt" else "safetensors")
    assert cap.summary().startswith("2 of 2 attention calls recorded (2 with dout")


def test_sdpa_is_restored_on_exit_and_when_the_block_raises(tmp_path, model):
    original = F.scaled_dot_product_attention
    hooks = torch.nn.modules.module  # the global module hooks that name layers
    before = (len(hooks._global_forward_pre_hooks), len(hooks._global_forward_hooks))
    with pytest.raises(RuntimeError, match="boom"):
        with capture_attention(tmp_path / "a.safetensors"):
            assert F.scaled_dot_product_attention is not original
            train_step(model)
            raise RuntimeError("boom")
    assert F.scaled_dot_product_attention is original
    # what was seen before the error is written
    assert len(read_index(tmp_path / "a.safetensors").calls) == 2
    # no module hook is left behind, nor a temporary file
    assert (len(hooks._global_forward_pre_hooks), len(hooks._global_forward_hooks)) == before
    assert [p.name for p in tmp_path.iterdir()] == ["a.safetensors"]


def test_max_calls_bounds_the_calls_recorded(tmp_path, model):
    with capture_attention(tmp_path / "a.safetensors", max_calls=1) as cap:
        train_step(model)
        train_step(model)
    index = read_index(tmp_path / "a.safetensors")
    assert [c["index"] for c in index.calls] == [0]
    assert cap.skipped == {"over max_calls": 3}


def test_max_bytes_bounds_the_tensors_recorded(tmp_path, model):
    one_call = 3 * 2 * 4 * 16 * 8 * 4  # q, k, v of one call, fp32: 12288 bytes
    with capture_attention(tmp_path / "a.safetensors", max_bytes=one_call - 1) as cap:
        train_step(model)
    assert read_index(tmp_path / "a.safetensors").calls == () and cap.bytes == 0
    assert cap.skipped == {"over max_bytes": 2}
    # q, k, v fit, dout (another 4096 bytes) does not by one byte: the call is kept, says why
    with capture_attention(tmp_path / "b.safetensors", max_bytes=one_call + 4095):
        train_step(model)
    calls = load_capture(tmp_path / "b.safetensors")
    assert len(calls) == 1 and calls[0].meta["dout"] == "over max_bytes"
    assert set(calls[0].tensors) == {"q", "k", "v"}


def test_layers_choose_the_calls_by_name(tmp_path, model):
    with capture_attention(tmp_path / "a.safetensors", layers=["blocks.1.*"]) as cap:
        train_step(model)
    assert [c["layer"] for c in read_index(tmp_path / "a.safetensors").calls] == [
        "blocks.1.attn"]
    assert cap.skipped == {"layer not chosen": 1}
    # the same with the model named: hooks on the matching modules only
    with capture_attention(tmp_path / "b.safetensors", model=model, layers="blocks.0.attn"):
        train_step(model)
    assert [c["layer"] for c in read_index(tmp_path / "b.safetensors").calls] == [
        "blocks.0.attn"]


def test_a_layer_block_names_calls_made_outside_modules(tmp_path):
    q = torch.randn(1, 2, 8, 4)
    with capture_attention(tmp_path / "a.safetensors", layers=["mine"]) as cap:
        with cap.layer("mine"):
            F.scaled_dot_product_attention(q, q, q, scale=0.5, dropout_p=0.0)
        F.scaled_dot_product_attention(q, q, q)  # unnamed: not chosen
    (call,) = read_index(tmp_path / "a.safetensors").calls
    assert call["layer"] == "mine" and call["scale"] == 0.5 and call["is_causal"] is False
    assert call["dout"] == "no gradient flows to its output"


def test_masks_are_recorded_when_they_fit(tmp_path, model):
    mask = torch.rand(16, 16) > 0.3
    mask.fill_diagonal_(True)
    with capture_attention(tmp_path / "a.safetensors") as cap:
        train_step(model, mask=mask)
    calls = load_capture(tmp_path / "a.safetensors")
    assert calls[0].meta["mask"] == "tensor" and torch.equal(calls[0].tensors["attn_mask"], mask)
    assert calls[0].meta["is_causal"] is False
    # one call's q, k, v (12288 bytes) and 255 more: the 256-byte mask misses by one byte
    with capture_attention(tmp_path / "b.safetensors", max_bytes=12288 + 255):
        train_step(model, mask=mask)
    (call,) = load_capture(tmp_path / "b.safetensors")
    assert call.meta["mask"] == "unsupported mask (over max_bytes)"
    assert "attn_mask" not in call.tensors and cap.summary()


def test_dout_says_why_it_is_missing(tmp_path, model):
    with capture_attention(tmp_path / "a.safetensors"):
        model(torch.randn(2, 16, 32))  # a forward, no backward inside the capture
    assert {c["dout"] for c in read_index(tmp_path / "a.safetensors").calls} == {
        "no backward reached it inside the capture"}
    with capture_attention(tmp_path / "b.safetensors"), torch.no_grad():
        model(torch.randn(2, 16, 32))
    assert {c["dout"] for c in read_index(tmp_path / "b.safetensors").calls} == {
        "no gradient flows to its output"}


def test_captures_do_not_nest_and_bad_bounds_are_one_line(tmp_path):
    with capture_attention(tmp_path / "a.safetensors"):
        with pytest.raises(CaptureError, match="already recording"):
            with capture_attention(tmp_path / "b.safetensors"):
                pass
    with pytest.raises(CaptureError, match=r"max_calls 0 \(expected 1\.\.2048\)"):
        capture_attention(tmp_path / "c.safetensors", max_calls=0)


def test_an_unwritable_path_is_one_line(tmp_path):
    with pytest.raises(CaptureError, match="No such file or directory"):
        with capture_attention(tmp_path / "missing" / "a.safetensors"):
            pass
