"""Compile the kernels for a GPU on a machine that has none.

The interpreter (``TRITON_INTERPRET=1``) runs the kernels' math on CPU but never compiles them,
so errors only the compiler sees would first show on a GPU: a Python global that is not
``tl.constexpr``, branches yielding different types, a tile needing more shared memory than the
chip has. Triton's wheel ships ptxas, so every kernel can be lowered to a cubin for a target GPU
right here. This module does that for representative variants (dtypes, head dims, every feature
flag; the split-KV decode kernels, contiguous and paged) and prints one JSON line per kernel:
shared memory, registers and stack bytes (spills, read with the cuobjdump Triton also ships),
whether the PTX uses wgmma (Hopper tensor cores) and cp.async (pipelined loads), and compile
time. Exit status 1 if a kernel does not fit in shared
memory.

    TRITON_INTERPRET=0 python -m attnbench.kernels.compile_check [--all | --variant TEXT] [--arch 90]

It must run with ``TRITON_INTERPRET=0`` (set in the environment: ``kernels`` defaults it to 1 on
a machine without a GPU). Arguments are specialised by the JIT's own binder, as a GPU launch
specialises them (:func:`specialize`): strides divisible by 16 get the divisibility hint, unit
strides become constants, and the kernels' ``do_not_specialize`` integers stay plain. Tiles:
the pinned configs (:func:`attnbench.kernels.configs.pinned_config`), what a first GPU hour
runs, unless a variant names its own.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

from attnbench.kernels import configs
from attnbench.kernels.decode import _decode_split, _merge_splits, decode_args
from attnbench.kernels.dropout import _keep_mask_kernel
from attnbench.kernels.flash_bwd import _bwd_dkdv, _bwd_dq, _bwd_preprocess, backward_args
from attnbench.kernels.flash_fwd import _attn_fwd, forward_args
from attnbench.kernels.params import FlashParams, is_interpreted

_TORCH_TO_TRITON = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
                    torch.int8: "i8", torch.int32: "i32", torch.int64: "i64",
                    torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5"}


def _tile(block_m: int, block_n: int, num_warps: int, num_stages: int) -> configs.BlockConfig:
    return configs.BlockConfig(block_m=block_m, block_n=block_n, num_warps=num_warps,
                               num_stages=num_stages)


@dataclass(frozen=True)
class Variant:
    name: str
    dtype: torch.dtype
    head_dim: int
    seqlen: int = 4096
    heads_q: int = 8
    heads_kv: int = 8
    features: dict = field(default_factory=dict)
    """FlashParams fields switched on (window, softcap, alibi, dropout)."""
    fp8_promote: int = 0
    """fp8: MAX_IMPRECISE_ACC (ATTNBENCH_FP8_MAX_IMPRECISE_ACC; 0: Triton's default)."""
    # None: the pinned config for the variant's head dims and dtype (configs.pinned_config).
    fwd: configs.BlockConfig | None = None
    dkdv: configs.BlockConfig | None = None
    dq: configs.BlockConfig | None = None


_ALL_FEATURES = dict(window_left=256, window_right=0, softcap=30.0,
                     alibi_slopes=tuple(2.0 ** -(i + 1) for i in range(8)), dropout_p=0.1,
                     dropout_seed=1234)

_PACK = (0, 4096, 5120, 5197, 8196)  # the mix: 4096, 1024, 77, 2999 tokens

QUICK = (
    Variant("bf16 d128 plain (the performance target)", torch.bfloat16, 128),
    Variant("bf16 d64 GQA every feature", torch.bfloat16, 64, heads_kv=2, features=_ALL_FEATURES),
    Variant("bf16 d128 packed (cu_seqlens), causal", torch.bfloat16, 128, seqlen=_PACK[-1],
            features=dict(window_right=0, cu_seqlens_q=_PACK, cu_seqlens_kv=_PACK)),
)
FULL = QUICK + (
    Variant("fp16 d64 causal", torch.float16, 64, features=dict(window_right=0)),
    Variant("fp32 d64 every feature (ieee dots)", torch.float32, 64, features=_ALL_FEATURES),
    Variant("bf16 d256", torch.bfloat16, 256),
    Variant("bf16 d48 (padded head dim), odd length", torch.bfloat16, 48, seqlen=4099),
)


# The fp8 forward (flash_forward_fp8; no backward): fp8 tl.dot needs sm_89+.
FP8_QUICK = (
    Variant("fp8 e4m3 d128 causal, bf16 out", torch.float8_e4m3fn, 128,
            features=dict(window_right=0)),
    Variant("fp8 e4m3 d128 causal, promoted once per key block", torch.float8_e4m3fn, 128,
            features=dict(window_right=0), fp8_promote=256),
)
FP8_FULL = FP8_QUICK + (
    Variant("fp8 e5m2 d64 GQA every feature but dropout, per-head descales",
            torch.float8_e5m2, 64, heads_kv=2,
            features={k: v for k, v in _ALL_FEATURES.items() if not k.startswith("dropout")}),
    Variant("fp8 e4m3 d16 (head dim padded to 32, fp8 dots' smallest K)", torch.float8_e4m3fn,
            16),
    Variant("fp8 e4m3 d128 packed (cu_seqlens), causal", torch.float8_e4m3fn, 128,
            seqlen=_PACK[-1], features=dict(window_right=0, cu_seqlens_q=_PACK,
                                             cu_seqlens_kv=_PACK)),
)


def check_fp8_variant(variant: Variant, target: GPUTarget) -> dict:
    meta = torch.device("meta")
    batch = 1 if "cu_seqlens_q" in variant.features else 2
    q = torch.empty(batch, variant.heads_q, variant.seqlen, variant.head_dim, dtype=variant.dtype,
                    device=meta)
    k = torch.empty(batch, variant.heads_kv, variant.seqlen, variant.head_dim,
                    dtype=variant.dtype, device=meta)
    descale = torch.empty(batch, variant.heads_kv, dtype=torch.float32, device=meta)
    params = FlashParams(sm_scale=variant.head_dim ** -0.5, **variant.features)
    _, _, args = forward_args(q, k, k, params, interpreted=False,
                              descales=(descale,) * 3, out_dtype=torch.bfloat16)
    args["MAX_IMPRECISE_ACC"] = variant.fp8_promote
    report = compile_kernel(_attn_fwd, args, variant.fwd or configs.pinned_config("fwd", args),
                            target)
    report["variant"] = variant.name
    return report


def specialization(kernel, args: dict, target: GPUTarget) -> list:
    """What the JIT's binder makes of ``args`` (a kernel's keyword arguments, meta tensors
    allowed: their address 0 is aligned, as torch's allocations are): one (type, hint) per
    parameter, the key a launch compiles a kernel for. The binder is Triton's own
    (``create_function_from_signature``, as ``JITFunction.create_binder`` builds it in triton 3.6
    and 3.9), so ``do_not_specialize`` applies as it does on a GPU."""
    return _bind(kernel, args, target)[2]


def _bind(kernel, args: dict, target: GPUTarget):
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    return (backend, *binder(**args))


def compile_kernel(kernel, args: dict, config: configs.BlockConfig | None, target: GPUTarget):
    """Compile one kernel as a launch would (the binder's specialisation, then triton.compile);
    return its report (dict)."""
    args = dict(args)
    if config is not None:
        args.update(BLOCK_M=config.block_m, BLOCK_N=config.block_n,
                    num_warps=config.num_warps, num_stages=config.num_stages)
    start = time.perf_counter()
    backend, bound, spec, options = _bind(kernel, args, target)
    options, signature, constexprs, attrs = kernel._pack_args(backend, args, bound, spec, options)
    compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target,
                              options=options.__dict__)
    ptx = compiled.asm["ptx"]
    return {"kernel": kernel.__name__, "config": None if config is None else asdict(config),
            "shared_bytes": compiled.metadata.shared, **_resource_usage(compiled.asm["cubin"]),
            "wgmma": ptx.count("wgmma.mma_async"), "mma": ptx.count("mma.sync"),
            "cp_async": ptx.count("cp.async.cg"),
            # per wgmma dot: how many products before its sum is promoted to fp32 (fp8 only)
            "imprecise_acc": sorted({int(n) for n in re.findall(
                r"warp_group_dot .*maxNumImpreciseAcc = (\d+)", compiled.asm["ttgir"])}),
            "seconds": round(time.perf_counter() - start, 1)}


def _resource_usage(cubin: bytes) -> dict:
    """Registers per thread and stack bytes (spills) from the cuobjdump Triton ships."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return {"registers": None, "stack_bytes": None}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        text = subprocess.run([str(tool), "-res-usage", str(path)], capture_output=True,
                              text=True).stdout
    regs, stack = re.search(r"REG:(\d+)", text), re.search(r"STACK:(\d+)", text)
    return {"registers": int(regs.group(1)) if regs else None,
            "stack_bytes": int(stack.group(1)) if stack else None}


def check_variant(variant: Variant, target: GPUTarget) -> list[dict]:
    meta = torch.device("meta")
    batch = 1 if "cu_seqlens_q" in variant.features else 2  # a pack is one buffer
    q = torch.empty(batch, variant.heads_q, variant.seqlen, variant.head_dim, dtype=variant.dtype,
                    device=meta)
    k = torch.empty(batch, variant.heads_kv, variant.seqlen, variant.head_dim, dtype=variant.dtype,
                    device=meta)
    params = FlashParams(sm_scale=variant.head_dim ** -0.5, **variant.features)
    out, lse, fwd_args = forward_args(q, k, k, params, interpreted=False)
    _, bwd = backward_args(q, k, k, out, lse, out, params, interpreted=False)
    pinned = {kind: configs.pinned_config(kind, fwd_args) for kind in configs.SPACES}
    reports = [compile_kernel(_attn_fwd, fwd_args, variant.fwd or pinned["fwd"], target),
               compile_kernel(_bwd_preprocess, bwd["preprocess"], None, target),
               compile_kernel(_bwd_dkdv, bwd["dkdv"], variant.dkdv or pinned["bwd_dkdv"], target),
               compile_kernel(_bwd_dq, bwd["dq"], variant.dq or pinned["bwd_dq"], target)]
    for report in reports:
        report["variant"] = variant.name
    return reports


def check_keep_mask(target: GPUTarget) -> dict:
    meta = torch.device("meta")
    idx = torch.empty(64, dtype=torch.int32, device=meta)
    tile = configs.DROPOUT_MASK_TILE
    args = dict(b_ptr=idx, h_ptr=idx, i_ptr=idx, j_ptr=idx,
                out_ptr=torch.empty(8, dtype=torch.int8, device=meta), n_h=8, n_i=203, n_j=203,
                seed=1234, threshold=214748365, BLOCK_I=tile.block_m, BLOCK_J=tile.block_n)
    report = compile_kernel(_keep_mask_kernel, args, None, target)
    report["variant"] = "dropout keep-mask materializer"
    return report


DECODE_VARIANTS = (
    # (name, page size, q tokens, kv heads, FlashParams features): a Llama-3-8B layer, bf16 d128
    ("decode bf16 d128 GQA 32/8 contiguous", 0, 1, 8, {}),
    ("decode bf16 d128 GQA 32/8 paged 16, 4 tokens, causal", 16, 4, 8, dict(window_right=0)),
    ("decode bf16 d128 MQA paged 256, every feature", 256, 1, 1,
     dict(window_left=4096, window_right=0, softcap=30.0,
          alibi_slopes=tuple(2.0 ** -(i + 1) for i in range(32)))),
)


def check_decode(target: GPUTarget) -> list[dict]:
    """The split-KV decode kernel and its merge (kernels.decode), contiguous and paged."""
    meta = torch.device("meta")
    reports = []
    for name, page, seqlen_q, heads_kv, features in DECODE_VARIANTS:
        q = torch.empty(2, 32, seqlen_q, 128, dtype=torch.bfloat16, device=meta)
        cache = ((2 * 4096 // page, page, heads_kv, 128) if page else (2, heads_kv, 65536, 128))
        k = torch.empty(cache, dtype=torch.bfloat16, device=meta)
        table = torch.empty(2, 4096 // max(page, 1), dtype=torch.int32, device=meta)
        launch = decode_args(q, k, k, FlashParams(sm_scale=128 ** -0.5, **features),
                             seqlens_k=torch.empty(2, dtype=torch.int32, device=meta),
                             max_seqlen_k=65536, heads_kv=heads_kv,
                             block_table=table if page else None, page_size=page,
                             interpreted=False)
        for kernel, args in ((_decode_split, launch["split"]), (_merge_splits, launch["merge"])):
            report = compile_kernel(kernel, args, None, target)
            report["variant"] = name
            reports.append(report)
    return reports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true",
                        help="every variant and the keep-mask kernel, not the quick two")
    parser.add_argument("--variant", help="only variants whose name contains this text")
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability x10")
    args = parser.parse_args(argv)
    if is_interpreted(_attn_fwd):
        print("attnbench.kernels.compile_check: run with TRITON_INTERPRET=0", file=sys.stderr)
        return 2
    target = GPUTarget("cuda", args.arch, 32)
    budget = configs.DEFAULT_SHARED_MEMORY
    failed = False
    variants = FULL if (args.all or args.variant) else QUICK
    if args.variant:
        variants = [v for v in variants if args.variant in v.name]
    fp8 = FP8_FULL if (args.all or args.variant) else FP8_QUICK
    if args.variant:
        fp8 = [v for v in fp8 if args.variant in v.name]
        if not variants and not fp8:
            print(f"attnbench.kernels.compile_check: no variant matches {args.variant!r}", file=sys.stderr)
            return 2
    reports = [r for v in variants for r in check_variant(v, target)]
    if args.arch >= 89:  # fp8 dots need sm_89+
        reports += [check_fp8_variant(v, target) for v in fp8]
    for report in reports:
        report["fits"] = report["shared_bytes"] <= budget
        failed |= not report["fits"]
        print(json.dumps(report), flush=True)
    if args.all or not args.variant:
        for report in check_decode(target):
            report["fits"] = report["shared_bytes"] <= budget
            failed |= not report["fits"]
            print(json.dumps(report), flush=True)
    if args.all:
        print(json.dumps(check_keep_mask(target)), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
