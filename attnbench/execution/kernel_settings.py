"""A case's settings for our Triton kernels, and the ``compile`` section of its record.

The sweep's option ``kernel_configs`` and the case's ``fp8_promotion`` reach the kernels as
ATTNBENCH_KERNEL_CONFIGS and ATTNBENCH_FP8_MAX_IMPRECISE_ACC (read at every launch), set for the
duration of one case and restored after (the run-wide option ``fp8_max_imprecise_acc`` is folded
into the cases when the sweep is read: :func:`attnbench.sweep.load.parse_sweep`). Meanwhile a :class:`CompileWatch` counts Triton's
compiles and notes the tile config of every launch, for the record::

    "compile": {"mode": "pinned", "interpreted": false,
                "seconds": 2.41, "kernels": 4,      # Triton compiles in this case (hooks)
                "autotune_s": 0.0,                  # autotuner benchmarking (autotune mode)
                "configs": {"_attn_fwd": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8,
                                          "num_stages": 3}, ...},
                "variant": "bf16 d128 gqa window fwd+bwd pinned",   # attnbench.kernels.warm
                "fp8_max_imprecise_acc": 0}         # fp8 cases only
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from attnbench.dtypes import is_fp8
from attnbench.kernels.compile_watch import CompileWatch  # imports no triton: may be absent
from attnbench.resources import ENV_FP8_MAX_IMPRECISE_ACC, ENV_KERNEL_CONFIGS
from attnbench.sweep.case import Case
from attnbench.sweep.options import RunOptions


@contextmanager
def kernel_settings(options: RunOptions, case: Case) -> Iterator[CompileWatch]:
    """Set the kernels' variables from ``options`` and ``case`` and watch compiles, for one
    case."""
    wanted = {ENV_KERNEL_CONFIGS: options.kernel_configs,
              ENV_FP8_MAX_IMPRECISE_ACC: str(case.fp8_promotion)}
    saved = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    watch = CompileWatch().start()
    try:
        yield watch
    finally:
        watch.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def compile_section(case: Case, options: RunOptions, watch: CompileWatch
                    ) -> Optional[dict[str, Any]]:
    """The record's ``compile`` section; None when no Triton kernel launched or compiled (a
    case of another backend, a refused one)."""
    summary = watch.summary()
    if not summary["configs"] and not summary["kernels"]:
        return None
    from attnbench.kernels.flash_fwd import kernels_interpreted  # a kernel ran: triton is here
    from attnbench.kernels.warm import label, variant_of

    section = {"mode": options.kernel_configs, "interpreted": kernels_interpreted(), **summary}
    variant = variant_of(case, options.kernel_configs)
    if variant is not None:
        section["variant"] = label(variant)
    if is_fp8(case.dtype):
        section["fp8_max_imprecise_acc"] = case.fp8_promotion
    return section
