"""Pre-warming Triton's cache: the kernels a set of cases will compile, compiled ahead of time.

:func:`variants` reads cases (anything with the :class:`attnbench.sweep.case.Case` fields) and
returns the distinct *compile variants* the ``triton`` backend would compile for them: JSON-able
dicts of what decides a compiled kernel -- kernel names, dtype, head dims (exact and padded),
the constexpr feature flags, MHA or GQA, the config mode. Lengths, offsets, seeds, window
bounds and head counts are not in it: the kernels do not specialise on them
(:data:`attnbench.kernels.common.RUNTIME_INTS`), so one variant serves every length. (Head
dims that are not multiples of 16 make strides' divisibility depend on lengths and heads; such
variants carry the residues mod 16 and the heads.)

:func:`compile_variant` compiles every kernel of one variant on the current CUDA device by
launching the real launchers on minimal tensors specialised like the real ones, timing
nothing. Run it in one process per variant, in parallel: Triton's on-disk cache is shared, so
the sweep's processes then load each kernel in tens of milliseconds instead of compiling it
for seconds. Without CUDA it compiles nothing and says so.

    python -m attnbench.kernels.warm VARIANT_JSON      # one variant, its result as JSON
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Iterable, Optional

from attnbench.dtypes import is_fp8
from attnbench.kernels.configs import kernel_config_mode
from attnbench.kernels.params import padded_head_dim, triton_next_power_of_2
from attnbench.resources import ENV_FP8_MAX_IMPRECISE_ACC, ENV_KERNEL_CONFIGS

BACKEND = "triton"
FLASH_FORWARD = ("_attn_fwd",)
FLASH_BACKWARD = ("_bwd_preprocess", "_bwd_dkdv", "_bwd_dq")
KEEP_MASK = ("_keep_mask_kernel",)
DECODE = ("_decode_split", "_merge_splits")
DECODE_BLOCK_N = 64  # kernels.decode.decode_args on a GPU


def variants(cases: Iterable[Any], kernel_configs: Optional[str] = None,
             fp8_max_imprecise_acc: Optional[int] = None) -> list[dict]:
    """The distinct compile variants of the ``triton`` cases among ``cases``, sorted (the same
    list whatever the cases' order). ``kernel_configs``: the run's option, and
    ``fp8_max_imprecise_acc`` the promotion of fp8 cases that name none (their ``fp8_promotion``:
    0) (default: what the environment says, as the kernels read it)."""
    mode = kernel_configs or kernel_config_mode()
    if fp8_max_imprecise_acc is None:
        from attnbench.kernels.fp8 import max_imprecise_acc

        fp8_max_imprecise_acc = max_imprecise_acc()
    found = {}
    for case in cases:
        variant = variant_of(case, mode, fp8_max_imprecise_acc)
        if variant is not None:
            found[json.dumps(variant, sort_keys=True)] = variant
    return [found[key] for key in sorted(found)]


def variant_of(case: Any, mode: str = "autotune", fp8_max_imprecise_acc: int = 0
               ) -> Optional[dict]:
    """One case's compile variant (None: not the ``triton`` backend). fp8: the case's
    ``fp8_promotion``, else ``fp8_max_imprecise_acc``."""
    if case.backend != BACKEND:
        return None
    heads_kv = case.heads_kv or case.heads_q
    head_dim_v = case.head_dim_v or case.head_dim
    seqlen_kv = case.seqlen_kv or case.seqlen_q
    left, right = case.window_bounds
    variant: dict[str, Any] = {
        "dtype": case.dtype, "head_dim": case.head_dim, "head_dim_v": head_dim_v,
        "block_d": padded_head_dim(case.head_dim), "block_dv": padded_head_dim(head_dim_v),
        "window": left >= 0 or right >= 0, "softcap": case.softcap > 0,
        "alibi": case.bias == "alibi", "kernel_configs": mode}
    if case.decode:
        group = case.heads_q // heads_kv
        rows = group * case.seqlen_q
        variant.update(kernels=list(DECODE), group=group, seqlen_q=case.seqlen_q,
                       page_size=case.page_size, block_s=_decode_block_s(case, heads_kv, rows))
    elif is_fp8(case.dtype):
        variant.update(kernels=list(FLASH_FORWARD), group="mha" if case.heads_q == heads_kv
                       else "gqa", varlen=case.is_packed,
                       fp8_max_imprecise_acc=getattr(case, "fp8_promotion", 0)
                       or fp8_max_imprecise_acc)
    else:
        kernels = FLASH_FORWARD + (FLASH_BACKWARD if case.backward else ())
        kernels += KEEP_MASK if case.dropout > 0 else ()
        variant.update(kernels=list(kernels), group="mha" if case.heads_q == heads_kv
                       else "gqa", varlen=case.is_packed, dropout=case.dropout > 0)
    if case.head_dim % 16 or head_dim_v % 16:  # strides' divisibility follows lengths and heads
        variant.update(heads_q=case.heads_q, heads_kv=heads_kv,
                       seqlen_q_mod16=case.seqlen_q % 16, seqlen_kv_mod16=seqlen_kv % 16)
    return variant


def label(variant: dict) -> str:
    """A short name: ``bf16 d128 gqa causal-or-window fwd+bwd pinned``."""
    dims = (f"d{variant['head_dim']}" if variant["head_dim"] == variant["head_dim_v"]
            else f"d{variant['head_dim']}/{variant['head_dim_v']}")
    parts = [variant["dtype"], dims]
    if "page_size" in variant:
        parts += [f"decode g{variant['group']} q{variant['seqlen_q']} p{variant['page_size']}"]
    else:
        parts.append(variant["group"])
    parts += [f for f in ("varlen", "window", "softcap", "alibi", "dropout") if variant.get(f)]
    if "_bwd_dkdv" in variant["kernels"]:
        parts.append("fwd+bwd")
    if variant.get("fp8_max_imprecise_acc"):
        parts.append(f"promote{variant['fp8_max_imprecise_acc']}")
    return " ".join(parts + [variant["kernel_configs"]])


_TUNED = {"_attn_fwd": "fwd", "_bwd_dkdv": "bwd_dkdv", "_bwd_dq": "bwd_dq"}
LONG = 1 << 20
"""A length past every tile: the autotuner's length rule prunes nothing there."""


def compile_count(variant: dict) -> dict[str, int]:
    """Kernels each kernel of ``variant`` compiles: 1 in pinned mode and for the kernels that
    are never autotuned (delta pass, decode, mask materializer); in autotune mode the configs
    of its space that survive the pruning rules at long lengths on an H100/H200 (shared memory
    ``DEFAULT_SHARED_MEMORY``): bf16 28 at d128, 45 at d64 over forward, dK/dV and dQ."""
    from attnbench.kernels import configs

    counts = {}
    for kernel in variant["kernels"]:
        kind = _TUNED.get(kernel)
        if kind is None or variant["kernel_configs"] == "pinned":
            counts[kernel] = 1
            continue
        fp8 = variant["dtype"].startswith("fp8")
        args = dict(BLOCK_D=max(variant["block_d"], 32) if fp8 else variant["block_d"],
                    BLOCK_DV=variant["block_dv"], seqlen_q=LONG, seqlen_k=LONG,
                    DOT_PRECISION="ieee" if variant["dtype"] == "fp32" else "tf32")
        prune = {"fwd": configs.prune_fwd, "bwd_dkdv": configs.prune_bwd_dkdv,
                 "bwd_dq": configs.prune_bwd_dq}[kind]
        counts[kernel] = len(prune(configs.SPACES[kind], {}, **args))
    return counts


def _decode_block_s(case: Any, heads_kv: int, rows: int) -> int:
    """BLOCK_S of the merge kernel: the split count rounded up to a power of two (the one
    decode constexpr that follows the call's size; kernels.decode.num_splits on a GPU)."""
    from attnbench.kernels.decode import num_splits

    block_m = max(16, min(64, triton_next_power_of_2(rows)))
    longest = max(case.seqlens_kv) if case.seqlens_kv else (case.seqlen_kv or case.seqlen_q)
    batch = len(case.seqlens_kv) if case.seqlens_kv else case.batch
    splits = num_splits(batch * heads_kv, -(-rows // block_m), longest, DECODE_BLOCK_N,
                        interpreted=False)
    return triton_next_power_of_2(splits)


# -- compiling ---------------------------------------------------------------------------------
def compiles_here() -> bool:
    """Whether :func:`compile_variant` would compile anything in this process (a CUDA device
    torch can use); without one, the pre-warm starts no process per variant."""
    import torch

    return torch.cuda.is_available()


def compile_variant(variant: dict) -> dict:
    """Compile every kernel of ``variant`` on the current CUDA device (nothing timed):
    ``{"variant", "seconds", "kernels", "configs": {kernel: {BLOCK_M, BLOCK_N, num_warps,
    num_stages}}}``; seconds and kernels from Triton's compile hooks (kernels: compiles this
    call made; 0 when everything came from the cache). No CUDA: the launchers run in Triton's
    interpreter (the rehearsal), seconds 0, kernels 0, ``launched`` and a ``note``."""
    import time

    import torch

    from attnbench.kernels.warm_launch import launch_variant

    if not torch.cuda.is_available():
        # The rehearsal: the real launchers on the variant's minimal tensors, interpreted, so a
        # variant the launchers cannot take fails here as it would on a GPU.
        began = time.perf_counter()
        launch_variant(variant, torch.device("cpu"))
        return {"variant": variant, "seconds": 0.0, "kernels": 0, "configs": {},
                "launched": len(variant.get("kernels", ())),
                "launch_s": round(time.perf_counter() - began, 3),
                "note": "no CUDA device: launched in Triton's interpreter, nothing compiled"}
    from attnbench.kernels.compile_watch import CompileWatch

    saved = {k: os.environ.get(k) for k in (ENV_KERNEL_CONFIGS, ENV_FP8_MAX_IMPRECISE_ACC)}
    os.environ[ENV_KERNEL_CONFIGS] = variant["kernel_configs"]
    os.environ[ENV_FP8_MAX_IMPRECISE_ACC] = str(variant.get("fp8_max_imprecise_acc", 0))
    try:
        with CompileWatch() as watch:
            launch_variant(variant, torch.device("cuda"))
            torch.cuda.synchronize()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    summary = watch.summary()
    out = {"variant": variant, "seconds": summary["seconds"] or 0.0,
           "kernels": summary["kernels"] or 0, "configs": summary["configs"]}
    if "note" in summary:
        out["note"] = summary["note"]
    return out


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m attnbench.kernels.warm VARIANT_JSON", file=sys.stderr)
        return 2
    try:
        variant = json.loads(argv[0])
    except json.JSONDecodeError as exc:
        print(f"attnbench.kernels.warm: VARIANT_JSON: not JSON ({exc.msg})", file=sys.stderr)
        return 2
    print(json.dumps(compile_variant(variant)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
