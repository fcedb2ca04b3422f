"""``attnbench capture``: a script's calls recorded as the user types it, ``--list`` one line a
call, and a hostile file one line with exit status 2."""

from __future__ import annotations

import struct
import subprocess
import sys

import pytest

from attnbench.capture.listing import list_capture
from attnbench.capture.loader import read_index
from attnbench.cli import main
from helpers import SUPPORT, attnbench_cmd

SCRIPT = SUPPORT / "capture_model.py"


def test_a_script_runs_inside_a_capture_and_keeps_its_exit_status(tmp_path, cli_env):
    out = tmp_path / "acts.safetensors"
    proc = subprocess.run([*attnbench_cmd(), "capture", "--out", str(out), "--layers",
                           "blocks.1.*", "--", "python", str(SCRIPT), "3"],
                          capture_output=True, text=True, env=cli_env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 3, proc.stderr  # the script's own status
    assert "1 of 2 attention calls recorded (1 with dout" in proc.stderr
    (call,) = read_index(out).calls
    assert call["layer"] == "blocks.1.attn" and call["dout"] == "yes"


def test_list_prints_one_line_per_call(tmp_path, capsys):
    import torch

    from attnbench.capture.recorder import capture_attention

    path = tmp_path / "acts.safetensors"
    q = torch.randn(1, 2, 8, 4, dtype=torch.bfloat16)
    with capture_attention(path) as cap:
        with cap.layer("blocks.3.attn\x1b[2J"):  # a name that would clear the screen
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert main(["capture", "--list", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{path}: safetensors, 1 call, 384 bytes of tensors"
    assert lines[1] == ("0  blocks.3.attn\\x1b[2J  (call 0)  q 1x2x8x4 k 1x2x8x4 v 1x2x8x4  "
                        "bfloat16 causal scale=0.5 dropout=0 mask=none "
                        "dout=no gradient flows to its output")
    assert list_capture(path) == lines


def test_list_needs_no_torch(tmp_path):
    import torch

    from attnbench.capture.recorder import capture_attention

    path = tmp_path / "acts.safetensors"
    with capture_attention(path):
        q = torch.randn(1, 1, 4, 4)
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
    code = ("import sys; sys.modules['torch'] = None\n"
            "from attnbench.cli import main\n"
            f"raise SystemExit(main(['capture', '--list', {str(path)!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and "1 call," in proc.stdout, proc.stderr


@pytest.mark.parametrize("argv, message", [
    (["capture"], "expected --list FILE, or --out FILE -- SCRIPT"),
    (["capture", "--out", "x.safetensors", "--", "python", "absent.py"], "absent.py: no such"),
    (["capture", "--list", "a", "--out", "b"], "--list FILE takes no --out"),
])
def test_bad_arguments_are_one_line_and_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1


def test_a_hostile_file_is_one_line_and_exit_2(tmp_path, capsys):
    path = tmp_path / "evil.safetensors"
    path.write_bytes(struct.pack("<Q", 2**63) + b"{}")
    assert main(["capture", "--list", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == (f"attnbench: error: capture {path}: header of {2**63} bytes "
                   f"(expected at most 1048576)\n")
