"""Things that misbehave on purpose, for testing the harness: backends and rank functions.

Backends (registered as ``testing.<name>`` in :mod:`attnbench.backends`; each fails in
``forward``, the first call a case makes):

* ``testing.segfault`` — reads address 0 through ctypes: a real SIGSEGV, not a raised signal.
* ``testing.hang``     — sleeps forever.
* ``testing.oom``      — raises ``torch.OutOfMemoryError`` (torch >= 2.5; ``MemoryError`` where
  the running torch lacks it).
* ``testing.raises``   — raises ``RuntimeError("deliberate failure")``.
* ``testing.noop``     — zeros of the right shapes at once: a floor for harness overhead. It fails
  every accuracy check, as it should.

Rank functions (``"attnbench.execution.testing:<name>"`` for :meth:`RankPool.run`; they live in
the package because a rank process imports them, and ``tests/`` is not importable there). They
import nothing heavy, so pool tests need no torch.

Legend: B = batch, Hq / Hkv = heads, Sq / Sk = lengths, D / Dv = head dims.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from typing import Any

from attnbench.backends.base import Forward

# -- backends ------------------------------------------------------------------------------------


class _Misbehaving:
    keep_mask = None

    def supports(self, case, device) -> None:
        return None

    def backward(self, ctx, dout):
        q, k, v = ctx
        return q.new_zeros(q.shape), k.new_zeros(k.shape), v.new_zeros(v.shape)


class SegfaultBackend(_Misbehaving):
    name = "testing.segfault"

    def forward(self, q, k, v, spec) -> Forward:
        segfault(None)
        raise AssertionError("unreachable: reading address 0 did not fault")


class HangBackend(_Misbehaving):
    name = "testing.hang"

    def forward(self, q, k, v, spec) -> Forward:
        sleep_forever(None)
        raise AssertionError("unreachable")


class OomBackend(_Misbehaving):
    name = "testing.oom"

    def forward(self, q, k, v, spec) -> Forward:
        import torch

        oom = getattr(torch, "OutOfMemoryError", MemoryError)  # torch.OutOfMemoryError: >= 2.5
        raise oom(f"testing.oom: deliberate out of memory for q of shape {tuple(q.shape)}")


class RaisesBackend(_Misbehaving):
    name = "testing.raises"

    def forward(self, q, k, v, spec) -> Forward:
        raise RuntimeError("deliberate failure")


class NoopBackend(_Misbehaving):
    name = "testing.noop"

    def forward(self, q, k, v, spec) -> Forward:
        # q: (B, Hq, Sq, D), v: (B, Hkv, Sk, Dv) -> out: (B, Hq, Sq, Dv); no log-sum-exp exposed.
        batch, heads_q, seqlen_q, _ = q.shape
        out = q.new_zeros((batch, heads_q, seqlen_q, v.shape[-1]))
        return Forward(out=out, lse=None, ctx=(q, k, v))


# -- rank functions ------------------------------------------------------------------------------


def compile_then_work(payload: dict) -> str:
    """``compile_s`` seconds inside :func:`attnbench.backends.base.compiling` (as a backend's
    torch.compile), then ``work_s`` seconds of ordinary work."""
    from attnbench.backends.base import compiling

    with compiling():
        time.sleep(payload["compile_s"])
    time.sleep(payload.get("work_s", 0.0))
    return "done"


def echo(payload: Any) -> Any:
    return payload


def child_info(payload: Any) -> dict[str, Any]:
    """Where the call ran: pid, rank environment, torch state (without importing torch)."""
    torch = sys.modules.get("torch")
    return {
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "rank": int(os.environ.get("RANK", "-1")),
        "world_size": int(os.environ.get("WORLD_SIZE", "-1")),
        "env": {k: os.environ.get(k) for k in (payload or {}).get("env", ())},
        "torch_imported": torch is not None,
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "cuda_initialized": bool(torch is not None and torch.cuda.is_initialized()),
    }


def segfault(payload: Any) -> None:
    """A real invalid read: address 0 is never mapped."""
    ctypes.string_at(0)


def sleep_forever(payload: Any) -> None:
    while True:
        time.sleep(3600)


def raise_error(payload: Any) -> None:
    raise RuntimeError("deliberate failure")


def allocate_too_much(payload: Any) -> None:
    """A real allocation that fails: malloc refuses 4 EiB at once, so no memory is touched and
    the kernel OOM killer is never involved."""
    bytearray(1 << 62)


def kill_self(payload: Any) -> None:
    """Die by a signal the pool did not send (SIGKILL by default, as the OOM killer would)."""
    os.kill(os.getpid(), getattr(signal, (payload or {}).get("signal", "SIGKILL")))
    time.sleep(10)


def exit_now(payload: Any) -> None:
    os._exit((payload or {}).get("code", 3))


def chatter(payload: Any) -> str:
    """Print to stdout and stderr (which must not disturb the protocol), then answer."""
    for i in range(payload.get("lines", 100)):
        print(f"stdout line {i}")
        print(f"stderr line {i}", file=sys.stderr)
    return "done"


def ask_recycle(payload: Any) -> int:
    """Answer normally but ask the pool to replace this rank afterwards."""
    from attnbench.execution.child import recycle_after_call

    recycle_after_call("testing: pretend the CUDA context is poisoned")
    return os.getpid()


def unpicklable(payload: Any) -> Any:
    return lambda: None


def spawn_grandchild(payload: Any) -> int:
    """Start a long sleep in our process group and return its pid (it must die with us)."""
    return subprocess.Popen(["sleep", "300"]).pid


def fail_on_rank(payload: dict) -> int:
    """On rank ``payload["rank"]`` do ``payload["action"]`` (a function of this module);
    other ranks sleep ``payload.get("others_sleep", 0)`` s and return their rank."""
    rank = int(os.environ["RANK"])
    if rank == payload["rank"]:
        return globals()[payload["action"]](payload)
    time.sleep(payload.get("others_sleep", 0))
    return rank


def run_backend(payload: dict) -> dict[str, Any]:
    """forward + backward of a backend on tiny CPU inputs; returns the output shapes."""
    import torch

    from attnbench.backends import get_backend
    from attnbench.problem.attn_spec import AttnSpec

    backend = get_backend(payload["backend"])
    batch, heads_q, heads_kv, seqlen_q, seqlen_kv, dim, dim_v = payload.get(
        "shape", (1, 4, 2, 8, 16, 16, 8))
    q = torch.randn(batch, heads_q, seqlen_q, dim)
    k = torch.randn(batch, heads_kv, seqlen_kv, dim)
    v = torch.randn(batch, heads_kv, seqlen_kv, dim_v)
    fwd = backend.forward(q, k, v, AttnSpec(scale=dim ** -0.5))
    grads = backend.backward(fwd.ctx, torch.ones_like(fwd.out))
    return {"out": list(fwd.out.shape), "grads": [list(g.shape) for g in grads],
            "lse": None if fwd.lse is None else list(fwd.lse.shape)}
