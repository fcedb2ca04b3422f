"""``attnbench capture``: list what a capture holds, or record one from a script.

``attnbench capture --list FILE`` prints one line per call (no torch needed for a safetensors
file). ``attnbench capture --out FILE [--layers PATTERN ...] -- [python] SCRIPT [ARGS ...]``
runs SCRIPT in this process (as ``python SCRIPT ARGS`` would: ``sys.argv``, ``__main__``)
inside :func:`attnbench.capture.recorder.capture_attention`, layers named from the outermost
module a forward starts from; ``-m MODULE`` runs a module instead.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys

from attnbench.capture.listing import list_capture
from attnbench.errors import EXIT_OK, UsageError
from attnbench.validation import positive_int_argument

_PYTHONS = ("python", "python3")


def add_capture_command(sub) -> None:
    cmd = sub.add_parser(
        "capture", help="record the attention calls of your own script, or list a capture",
        description="record q, k, v (and dout) of scaled_dot_product_attention calls "
                    "(docs/capture.md)",
        usage="attnbench capture --list FILE\n       attnbench capture --out FILE "
              "[--layers PATTERN ...] [--max-calls N] [--max-bytes N] -- [python] SCRIPT "
              "[ARGS ...]")
    cmd.add_argument("--list", metavar="FILE", help="one line per recorded call of FILE")
    cmd.add_argument("--out", metavar="FILE",
                     help="where the capture goes (.safetensors; .pt: torch.save's format)")
    cmd.add_argument("--layers", nargs="+", metavar="PATTERN",
                     help="record only calls whose layer matches one of these fnmatch "
                          "patterns (blocks.3.attn, 'blocks.*.attn')")
    cmd.add_argument("--max-calls", type=positive_int_argument, default=None,
                     help="record at most N calls (default 16)")
    cmd.add_argument("--max-bytes", type=positive_int_argument, default=None,
                     help="record at most N bytes of tensors (default 1 GiB)")
    cmd.add_argument("script", nargs=argparse.REMAINDER,
                     help="after --: the script and its arguments")
    cmd.set_defaults(func=cmd_capture)


def cmd_capture(args: argparse.Namespace) -> int:
    if args.list:
        if args.out or args.script:
            raise UsageError("capture: --list FILE takes no --out and no script")
        for line in list_capture(args.list):
            print(line)
        return EXIT_OK
    script = list(args.script)
    if script[:1] == ["--"]:
        script = script[1:]
    if script and os.path.basename(script[0]) in _PYTHONS:
        script = script[1:]
    if not args.out or not script:
        raise UsageError("capture: expected --list FILE, or --out FILE -- SCRIPT [ARGS ...]")
    return _run_script(args, script)


def _run_script(args: argparse.Namespace, script: list[str]) -> int:
    from attnbench.capture.recorder import (DEFAULT_MAX_BYTES, DEFAULT_MAX_CALLS,
                                            capture_attention)

    module = script[1] if script[0] == "-m" and len(script) > 1 else None
    argv = script[1:] if module else script
    if not module and not os.path.isfile(script[0]):
        raise UsageError(f"capture: {script[0]}: no such script")
    saved_argv = sys.argv
    sys.argv = list(argv)
    status = EXIT_OK
    recorder = capture_attention(args.out, layers=args.layers,
                                 max_calls=args.max_calls or DEFAULT_MAX_CALLS,
                                 max_bytes=args.max_bytes or DEFAULT_MAX_BYTES)
    try:
        with recorder:
            try:
                if module:
                    runpy.run_module(module, run_name="__main__", alter_sys=True)
                else:
                    sys.path.insert(0, os.path.dirname(os.path.abspath(script[0])))
                    runpy.run_path(script[0], run_name="__main__")
            except SystemExit as exc:  # the script's own exit: the capture is still written
                code = exc.code
                status = code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        sys.argv = saved_argv
    print(f"attnbench: {recorder.summary()}", file=sys.stderr)
    return status
