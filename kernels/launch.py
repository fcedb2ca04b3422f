"""Launching an autotunable kernel: which tile config it runs with, and saying which one did.

The first source that applies wins:

1. the caller's explicit :class:`~attnbench.kernels.configs.BlockConfig` (tests pin small tiles);
2. under the interpreter, the launcher's fixed interpreter tile (nothing is autotuned there);
3. ``ATTNBENCH_KERNEL_CONFIGS=pinned``: :func:`~attnbench.kernels.configs.pinned_config`, one
   config per kernel and head-dim class, so a fresh GPU compiles one kernel per variant;
4. otherwise the autotuner over the kernel's space (``autotune``, the default).

Every launch reports its kernel and config to :mod:`attnbench.kernels.compile_watch`, so the
record of a case says which config ran, whichever source chose it.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

from attnbench.kernels import compile_watch, configs


def launch_tiled(kernel, tuned, kind: str, grid: Callable[[int, int], tuple], args: dict, *,
                 interpreted: bool, config: Optional[configs.BlockConfig],
                 interpreter_config: configs.BlockConfig) -> None:
    """Launch ``kernel`` (its autotuned form: ``tuned``) on ``grid(BLOCK_M, BLOCK_N)`` with
    ``args`` (everything but the tile); ``kind`` names its space in
    :data:`~attnbench.kernels.configs.SPACES`."""
    name = kernel.__name__
    if config is None and not interpreted:
        if configs.kernel_config_mode() == "pinned":
            config = configs.pinned_config(kind, args)
        else:
            _autotuned(tuned, name, grid, args)
            return
    config = config or interpreter_config
    kernel[grid(config.block_m, config.block_n)](
        **args, BLOCK_M=config.block_m, BLOCK_N=config.block_n, num_warps=config.num_warps,
        num_stages=config.num_stages)
    compile_watch.note_launch(name, config.to_dict())


def _autotuned(tuned, name: str, grid: Callable[[int, int], tuple], args: dict) -> None:
    # The autotuner benchmarks only on a key it has not seen: time that call, minus what it
    # spent compiling, as autotuning.
    seen, started = len(tuned.cache), time.perf_counter()
    compiled = compile_watch.compiled_seconds()
    tuned[lambda meta: grid(meta["BLOCK_M"], meta["BLOCK_N"])](**args)
    if len(tuned.cache) > seen:
        compile_watch.note_autotune(time.perf_counter() - started
                                    - (compile_watch.compiled_seconds() - compiled))
    compile_watch.note_launch(name, configs.BlockConfig.of(tuned.best_config).to_dict())
