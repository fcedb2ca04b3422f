"""What a case cost in Triton compiles, and which tile config each of our kernels ran with.

Compile seconds come from Triton's JIT hooks: ``triton.knobs.runtime.jit_cache_hook`` fires just
before a JITFunction compiles a specialization it has not got in memory, and
``jit_post_compile_hook`` just after (both in triton 3.4 and later; read in the 3.6 and 3.9
sources: ``JITFunction._do_compile``). The time between the two is the compile -- or the load
from Triton's on-disk cache, tens of milliseconds, when a pre-warm compiled it before -- and
nothing else: not the launch, not the autotuner's benchmarking (counted apart,
:func:`note_autotune`), not allocator growth. A first call's time minus a steady call's would
mix all of those in. Under the interpreter nothing compiles: 0 seconds, 0 kernels. Triton
without ``knobs`` (3.2, 3.3): the seconds are unknown (None) and the section says so.

The hooks are installed on the first :class:`CompileWatch` (never at import) and chain to any
hook already there. Launchers report the config of every launch (:func:`note_launch`); a watch
keeps the last one per kernel.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Optional

_LOCK = threading.Lock()
_ACTIVE: list["CompileWatch"] = []
_STARTED: dict[tuple[str, str], float] = {}
_INSTALLED: Optional[bool] = None  # None: not tried yet; False: this triton has no hooks


class CompileWatch:
    """Compiles, their seconds, autotuning seconds and launched configs between ``start()`` and
    ``stop()`` (or inside ``with``)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.kernels = 0
        self.autotune_s = 0.0
        self.configs: dict[str, dict[str, int]] = {}
        self.hooked = False

    def start(self) -> "CompileWatch":
        self.hooked = _install_hooks()
        with _LOCK:
            _ACTIVE.append(self)
        return self

    def stop(self) -> None:
        with _LOCK:
            if self in _ACTIVE:
                _ACTIVE.remove(self)

    def __enter__(self) -> "CompileWatch":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def summary(self) -> dict[str, Any]:
        """seconds (None when this Triton has no compile hooks), kernels, autotune_s, configs."""
        out: dict[str, Any] = {"seconds": round(self.seconds, 3) if self.hooked else None,
                               "kernels": self.kernels if self.hooked else None,
                               "autotune_s": round(self.autotune_s, 3),
                               "configs": dict(self.configs)}
        if not self.hooked:
            out["note"] = "this triton has no JIT compile hooks (triton.knobs, 3.4+)"
        return out


def note_launch(kernel: str, config: dict[str, int]) -> None:
    """A launcher ran ``kernel`` with ``config`` ({BLOCK_M, BLOCK_N, num_warps, num_stages})."""
    for watch in _ACTIVE:
        watch.configs[kernel] = config


def note_autotune(seconds: float) -> None:
    """The autotuner benchmarked configs for ``seconds`` (compile time already taken out)."""
    for watch in _ACTIVE:
        watch.autotune_s += max(0.0, seconds)


def compiled_seconds() -> float:
    """Seconds of compiling seen so far by the innermost active watch (0 if none): launchers
    take it out of an autotuning call's time."""
    return _ACTIVE[-1].seconds if _ACTIVE else 0.0


def _key(kwargs: dict) -> tuple[str, str]:
    fn = kwargs.get("fn")
    return (str(getattr(fn, "name", fn)), str(kwargs.get("key")))


def _before_compile(**kwargs) -> None:
    _STARTED[_key(kwargs)] = time.perf_counter()


def _after_compile(**kwargs) -> None:
    started = _STARTED.pop(_key(kwargs), None)
    if started is None:  # a chained hook skipped the compile, or a watch started in between
        return
    seconds = time.perf_counter() - started
    with _LOCK:
        for watch in _ACTIVE:
            watch.seconds += seconds
            watch.kernels += 1


def _install_hooks() -> bool:
    global _INSTALLED
    if _INSTALLED is not None:
        return _INSTALLED
    try:
        from triton import knobs
    except ImportError:
        _INSTALLED = False
        return False
    runtime = knobs.runtime
    before, after = runtime.jit_cache_hook, runtime.jit_post_compile_hook

    def cache_hook(**kwargs):
        _before_compile(**kwargs)
        # A truthy answer tells Triton to skip the compile: only a hook that was there before
        # ours may give one.
        return before(**kwargs) if before is not None else None

    def post_compile_hook(**kwargs):
        _after_compile(**kwargs)
        return after(**kwargs) if after is not None else None

    runtime.jit_cache_hook = cache_hook
    runtime.jit_post_compile_hook = post_compile_hook
    _INSTALLED = True
    return True
