"""attnbench's own Triton flash attention (forward, backward, dropout mask).

Modules: :mod:`attnbench.kernels.common` (device functions shared by every kernel), :mod:`attnbench.kernels.flash_fwd`,
:mod:`attnbench.kernels.flash_bwd`, :mod:`attnbench.kernels.dropout` (kernels plus their thin launchers),
:mod:`attnbench.kernels.configs` (tuning spaces, pruning rules, the pinned configs),
:mod:`attnbench.kernels.launch` (which config a launch runs), :mod:`attnbench.kernels.params`
(launch parameters), :mod:`attnbench.kernels.compile_watch` (compile seconds, launched configs),
:mod:`attnbench.kernels.warm` (compile variants and the cache pre-warm). The attnbench backend
is :mod:`attnbench.backends.triton_backend`.

Without a CUDA device the kernels run under Triton's interpreter. Triton decides between compiling
and interpreting when ``@triton.jit`` *decorates* a function, reading ``TRITON_INTERPRET`` at
that moment — and that includes Triton's own library functions (``tl.zeros``, ``tl.sum``,
``tl.philox``), decorated when ``triton.language`` is first imported. So the variable must be set
before anything in the process imports triton; this package sets it (``setdefault``: an explicit
``TRITON_INTERPRET=0/1`` wins) when no GPU is visible, and refuses to load, with the reason, if
triton was already imported in compiled mode: the kernels would fail inside the interpreter with
"Cannot call @triton.jit'd outside of the scope of a kernel".
"""

import os
import sys

from attnbench import package_face

# The launchers and what the backends and tests ask of the kernels; importing one loads its
# module (and triton) only then.
__all__, __getattr__ = package_face(__name__, {
    "common": ("UNBOUNDED", "key_ranges", "query_ranges"),
    "compile_watch": ("CompileWatch",),
    "configs": ("BlockConfig", "kernel_config_mode", "pinned_config"),
    "decode": ("decode_forward", "merge_splits_torch"),
    "dropout": ("keep_mask", "keep_mask_torch"),
    "flash_bwd": ("flash_backward",),
    "flash_fwd": ("FP8_MIN_CAPABILITY", "flash_forward", "flash_forward_fp8",
                  "kernels_interpreted"),
    "params": ("FlashParams", "dropout_threshold", "is_interpreted"),
    "warm": ("compile_count", "compile_variant", "label", "variant_of", "variants"),
})


def _interpret_without_gpu() -> None:
    import torch

    if torch.cuda.is_available():
        return
    os.environ.setdefault("TRITON_INTERPRET", "1")
    if os.environ["TRITON_INTERPRET"] != "1" or "triton.language" not in sys.modules:
        return
    from triton.language import standard
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(standard.zeros, InterpretedFunction):
        raise ImportError(
            "attnbench.kernels: no GPU, so the Triton kernels must run under TRITON_INTERPRET=1, but triton "
            "was imported before that was set (its library functions are compiled-mode). Export "
            "TRITON_INTERPRET=1, or import `attnbench.kernels` before anything imports triton.")


_interpret_without_gpu()
