"""``inputs: captured``: a case takes its shapes from the capture, refuses a sweep that says
otherwise, carries the capture's digest in its id, and runs on the captured tensors."""

from __future__ import annotations

import os

import pytest
import torch

from attnbench.backends import check_backend_name
from attnbench.capture.recorder import capture_attention
from attnbench.errors import SweepError
from attnbench.problem.inputs import make_inputs
from attnbench.sweep.case import Case, check_case_dict
from attnbench.sweep.load import load_sweep
from capture_model import TinyModel, train_step


@pytest.fixture
def capture(tmp_path, monkeypatch):
    """A capture of the tiny model's two calls (b2 s16 h4 d8 fp32, causal, with dout), and the
    layers that saw them; the test runs in its directory (FILE is relative to it)."""
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model = TinyModel()
    with capture_attention(tmp_path / "acts.safetensors"):
        train_step(model)
    return model


def _sweep(tmp_path, body: str) -> list[Case]:
    (tmp_path / "s.yaml").write_text("name: cap\n" + body)
    return load_sweep(str(tmp_path / "s.yaml"), check_backend_name).cases


def test_the_shapes_come_from_the_capture(tmp_path, capture):
    (case,) = _sweep(tmp_path, "defaults: {backend: naive, inputs: captured, "
                               "captured: acts.safetensors:1}\n")
    assert (case.batch, case.seqlen_q, case.seqlen_kv, case.heads_q, case.heads_kv,
            case.head_dim, case.head_dim_v, case.mask, case.dtype) == (
        2, 16, 16, 4, 4, 8, 8, "causal", "fp32")
    path, _, rest = case.captured.rpartition(":")
    assert path == str(tmp_path / "acts.safetensors") and rest.startswith("1@")
    assert "captured" in case.features and case.label.endswith(" seed0 acts.safetensors:1")
    # a stored record's case reads back, and a case that is not captured stays valid
    assert check_case_dict("r", case.to_dict()) == case
    assert check_case_dict("r", {"backend": "naive", "captured": ""}).captured == ""


def test_the_case_runs_on_the_captured_tensors_bit_for_bit(tmp_path, capture):
    (case,) = _sweep(tmp_path, "defaults: {backend: naive, inputs: captured, "
                               "captured: acts.safetensors:1}\n")
    q, k, v, dout = make_inputs(case)
    seen = capture.blocks[1].attn.seen[-1]
    for got, part in ((q, "q"), (k, "k"), (v, "v"), (dout, "dout")):
        assert torch.equal(got.view(torch.int32), seen[part].contiguous().view(torch.int32))


def test_the_digest_is_in_the_id(tmp_path, capture):
    body = "defaults: {backend: naive, inputs: captured, captured: acts.safetensors}\n"
    (first,) = _sweep(tmp_path, body)
    data = bytearray((tmp_path / "acts.safetensors").read_bytes())
    data[-1] ^= 1  # one bit of the last dout: another capture, same path and shapes
    (tmp_path / "acts.safetensors").write_bytes(bytes(data))
    stat = os.stat(tmp_path / "acts.safetensors")
    os.utime(tmp_path / "acts.safetensors", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    (second,) = _sweep(tmp_path, body)
    assert first.id != second.id and first.captured != second.captured
    assert first.replace(captured=second.captured) == second  # nothing else differs
    # the first case, handed to a rank now, is refused: its file is not the one it names
    from attnbench.errors import CaptureError

    with pytest.raises(CaptureError, match="the file changed since the sweep was read"):
        make_inputs(first)


def test_the_same_capture_elsewhere_is_the_same_case(tmp_path, capture):
    """The id holds the call and the digest, not the directory: a run on a laptop and one on a
    cluster that mounts the capture elsewhere compare."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "copy.safetensors").write_bytes(
        (tmp_path / "acts.safetensors").read_bytes())
    (here,) = _sweep(tmp_path, "defaults: {backend: naive, inputs: captured, "
                               "captured: acts.safetensors:1}\n")
    (there,) = _sweep(tmp_path, "defaults: {backend: naive, inputs: captured, "
                                "captured: elsewhere/copy.safetensors:1}\n")
    assert here.captured != there.captured and here.id == there.id
    (other_call,) = _sweep(tmp_path, "defaults: {backend: naive, inputs: captured, "
                                     "captured: acts.safetensors:0}\n")
    assert other_call.id != here.id


def test_a_sweep_that_contradicts_the_capture_is_refused(tmp_path, capture):
    with pytest.raises(SweepError) as info:
        _sweep(tmp_path, "defaults: {backend: naive, inputs: captured, "
                         "captured: acts.safetensors:0, heads_q: 8, dtype: bf16, mask: causal}\n")
    lines = str(info.value).splitlines()
    assert len(lines) == 2  # heads_q and dtype; mask agrees
    assert "heads_q: the sweep says 8, the capture 4" in lines[0]
    assert "dtype: the sweep says 'bf16', the capture 'fp32'" in lines[1]
    assert "leave it out to take the capture's" in lines[1]


@pytest.mark.parametrize("body, message", [
    ("{backend: naive, captured: acts.safetensors}", "captured: given with inputs 'normal', "
                                                     "expected inputs: captured"),
    ("{backend: naive, inputs: captured}", r"inputs: captured needs captured: FILE\[:call\]"),
    ("{backend: naive, inputs: captured, captured: acts.safetensors:2}",
     r"captured: capture .*acts.safetensors:2: no such call \(expected 0..1\)"),
    ("{backend: naive, inputs: captured, captured: absent.safetensors}", "cannot open"),
    ("{backend: naive, inputs: captured, captured: acts.safetensors, seqlens_q: [8, 8]}",
     "seqlens_q: a captured case is dense attention"),
    ("{backend: naive, inputs: captured, captured: 'acts.safetensors:0@0123456789abcdef'}",
     "has digest [0-9a-f]{16}, expected 0123456789abcdef"),
])
def test_what_cannot_be_a_captured_case_is_one_line(tmp_path, capture, body, message):
    with pytest.raises(SweepError, match=message):
        _sweep(tmp_path, f"defaults: {body}\n")


def test_a_hostile_capture_is_bad_input_not_a_traceback(tmp_path, capture):
    (tmp_path / "evil.safetensors").write_bytes(b"\xff" * 8 + b"{}")
    with pytest.raises(SweepError, match=r"captured: capture .*evil.safetensors: header of \d+ "
                                         r"bytes \(expected at most 1048576\)"):
        _sweep(tmp_path, "defaults: {backend: naive, inputs: captured, "
                         "captured: evil.safetensors}\n")


@pytest.mark.parametrize("backend, verdict", [("naive", "pass"), ("sdpa", "pass"),
                                              ("mutant.dq_log2_scale", "fail")])
def test_a_captured_case_is_judged_on_the_captured_tensors(tmp_path, capture, backend, verdict):
    """The whole judge (fp64 reference, fused baseline, identities) runs on the capture: a
    correct backend passes, a dQ off by a constant factor (the seed bug 2a) fails."""
    from attnbench.execution.case_runner import run_case
    from attnbench.sweep.options import RunOptions, TimingOptions

    (case,) = _sweep(tmp_path, f"defaults: {{backend: {backend}, inputs: captured, "
                               "captured: acts.safetensors:1}\n")
    record = run_case(case, RunOptions(timing=TimingOptions(enabled=False)))
    assert record["verdict"] == verdict, record["reason"]
    assert record["case"]["captured"] == case.captured
