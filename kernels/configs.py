"""Tuning spaces of the kernels, as data, and the named rules that prune them.

On a GPU every launcher autotunes over its space (keyed on the sequence lengths, head dims and
features); each ``prune_*`` function drops configs for a stated reason before anything is timed.
Under TRITON_INTERPRET=1 nothing is autotuned (the interpreter has no meaningful timings and runs
every config serially): the ``INTERPRETER_*`` blocks are used, picked for interpreter speed —
each program costs ~a fixed number of numpy calls, so fewer, larger tiles run faster.

The spaces start from the Triton fused-attention tutorial's Hopper settings (BLOCK_M 128 with
BLOCK_N 64/128 forward; 32 x 128 dK/dV and 128 x 32 dQ tiles backward), widened by one step each
way. Not measured here (this machine has no GPU): the autotuner picks at run time, and keeps its
choice on disk (``cache_results``), so only the first run of a shape pays for tuning.

Pinned mode (``ATTNBENCH_KERNEL_CONFIGS=pinned``, :func:`pinned_config`): no autotuning, one
config per kernel, head-dim class and dtype, picked from the same space by a named rule, so a
fresh GPU compiles one kernel per variant instead of every config of the space.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import os
from dataclasses import asdict, dataclass
from typing import Any, Callable

import triton

from attnbench.resources import ENV_KERNEL_CONFIGS, KERNEL_CONFIG_MODES

# Autotuning results kept on disk between processes (a rank pool's restart re-tunes nothing):
# ``cache_results`` came with Triton 3.4; older releases (3.1 pairs with torch 2.5) tune anew.
AUTOTUNE_CACHE = ({"cache_results": True}
                  if "cache_results" in inspect.signature(triton.autotune).parameters else {})


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockConfig:
    """Explicit tile sizes, for the interpreter and for tests that pin them."""

    block_m: int
    """Query rows per tile."""
    block_n: int
    """Key rows per tile."""
    num_warps: int = 4
    num_stages: int = 2

    def to_dict(self) -> dict[str, int]:
        """As records and the warm API name it: BLOCK_M, BLOCK_N, num_warps, num_stages."""
        d = asdict(self)
        return {"BLOCK_M": d["block_m"], "BLOCK_N": d["block_n"], "num_warps": d["num_warps"],
                "num_stages": d["num_stages"]}

    @classmethod
    def of(cls, config: triton.Config) -> "BlockConfig":
        return cls(block_m=config.kwargs["BLOCK_M"], block_n=config.kwargs["BLOCK_N"],
                   num_warps=config.num_warps, num_stages=config.num_stages)


INTERPRETER_FWD = BlockConfig(block_m=64, block_n=64)
INTERPRETER_BWD_DKDV = BlockConfig(block_m=64, block_n=64)
INTERPRETER_BWD_DQ = BlockConfig(block_m=64, block_n=64)
# The keep-mask materializer (reference side only) runs this tile on the GPU and in the
# interpreter alike: 128 x 128 keeps interpreter programs few (0.3 s vs 1 s at 64 x 64 for
# 4 x 203 x 203). Warps and stages: Triton's CUDA defaults (no loop to pipeline).
DROPOUT_MASK_TILE = BlockConfig(block_m=128, block_n=128, num_warps=4, num_stages=3)


def _space(block_m, block_n, num_warps, num_stages) -> list[triton.Config]:
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
            for m, n, w, s in itertools.product(block_m, block_n, num_warps, num_stages)]


# BLOCK_N 32 is left out forward: a 32-wide K tile halves the work per wgmma and per softmax
# update for nothing (32-row tiles pay off only backward, where two tiles live at once).
FWD_CONFIGS = _space(block_m=(64, 128), block_n=(64, 128), num_warps=(4, 8), num_stages=(2, 3, 4))
# dK/dV: a program owns BLOCK_N keys and streams BLOCK_M queries past them.
BWD_DKDV_CONFIGS = _space(block_m=(32, 64), block_n=(64, 128), num_warps=(4, 8),
                          num_stages=(2, 3, 4))
# dQ: a program owns BLOCK_M queries and streams BLOCK_N keys past them.
BWD_DQ_CONFIGS = _space(block_m=(64, 128), block_n=(32, 64), num_warps=(4, 8), num_stages=(2, 3, 4))

# Shared memory per block on the GPUs we target (H100/H200: 227 KiB usable; A100: 163 KiB). The
# device's own figure is used when the driver reports it.
DEFAULT_SHARED_MEMORY = 232_448


def _args(named_args: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    return {**named_args, **kwargs}


def _shared_memory_budget() -> int:
    try:
        from triton.runtime import driver

        device = driver.active.get_current_device()
        return int(driver.active.utils.get_device_properties(device)["max_shared_mem"])
    except Exception:  # no driver (interpreter) or an older API: fall back to the Hopper figure
        return DEFAULT_SHARED_MEMORY


def prune_tiles_longer_than_sequence(configs, args) -> list[triton.Config]:
    """A tile much longer than the sequence computes padding: keep tiles up to the sequence
    length rounded up to a power of two (the smallest tile always survives)."""
    seq_m = triton.next_power_of_2(args["seqlen_q"])
    seq_n = triton.next_power_of_2(args["seqlen_k"])
    kept = [c for c in configs if c.kwargs["BLOCK_M"] <= max(seq_m, 16)
            and c.kwargs["BLOCK_N"] <= max(seq_n, 16)]
    return kept or [min(configs, key=lambda c: c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"])]


def prune_shared_memory(configs, args) -> list[triton.Config]:
    """Drop configs whose pipelined K/V (or Q/dO) buffers cannot fit in shared memory: they fail
    to compile (head_dim 256 with 128-row tiles and 3+ stages, for instance). Estimate: stages x
    streamed tile bytes + the resident tile, 16-bit operands."""
    budget = _shared_memory_budget()
    d, dv = args["BLOCK_D"], args["BLOCK_DV"]
    elem = 4 if args.get("DOT_PRECISION") == "ieee" else 2  # fp32 inputs stay fp32

    def need(c: triton.Config) -> int:
        m, n = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]
        streamed, resident = args["_streamed"](m, n, d, dv), args["_resident"](m, n, d, dv)
        return (c.num_stages * streamed + resident) * elem

    kept = [c for c in configs if need(c) <= budget]
    return kept or [min(configs, key=need)]


def prune_register_spills(configs, args) -> list[triton.Config]:
    """Drop configs whose fp32 tiles cannot live in registers: at more than
    ``MAX_LIVE_FP32_PER_THREAD`` live fp32 values per thread (score tile plus accumulators,
    summed over the warps' threads) ptxas spills to local memory, which costs more than the
    bigger tile gains."""
    d, dv = args["BLOCK_D"], args["BLOCK_DV"]
    kept = [c for c in configs
            if args["_live"](c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], d, dv) / (32 * c.num_warps)
            <= MAX_LIVE_FP32_PER_THREAD]
    return kept or configs


def prune_idle_warpgroups(configs, args) -> list[triton.Config]:
    """Hopper's wgmma gives each warpgroup (4 warps) at least 64 rows of the tile's matmuls:
    8 warps need 128 rows (the query rows forward and for dQ, the key rows for dK/dV), or
    half of them wait."""
    kept = [c for c in configs
            if args["_rows"](c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) >= 64 * (c.num_warps // 4)]
    return kept or configs


# Measured with attnbench.kernels.compile_check on sm_90 (bf16, Triton 3.9), live values per thread ->
# spill: fwd d128 64x64/4w 96 none, 128x64/4w 192 264 B, 128x128/8w 128 none; dK/dV d128
# 32x64/4w 144 none, 64x64/4w 160 112 B, 32x128/8w 144 none, 64x128/8w 160 88 B; dK/dV d64
# 32x128/4w 160 120 B; dQ d128 128x32/4w 160 80 B, 128x32/8w 80 none. The one miss at 144:
# fwd d128 64x128/4w (128, spills 32 B).
MAX_LIVE_FP32_PER_THREAD = 144


def _pruner(*rules: Callable, rows, streamed, resident, live) -> Callable:
    def prune(configs, named_args, **kwargs):
        args = _args(named_args, kwargs)
        args.update(_rows=rows, _streamed=streamed, _resident=resident, _live=live)
        for rule in rules:
            configs = rule(configs, args)
        return configs

    prune.__doc__ = "Applies, in order: " + ", ".join(r.__name__ for r in rules)
    return prune


_RULES = (prune_tiles_longer_than_sequence, prune_shared_memory, prune_register_spills,
          prune_idle_warpgroups)
# Tile shapes per kernel (m = BLOCK_M, n = BLOCK_N, d / dv = padded head dims):
_SHAPES = {
    # forward streams K and V (n x d, n x dv), keeps Q (m x d); lives: scores m x n, acc m x dv.
    "fwd": dict(rows=lambda m, n: m, streamed=lambda m, n, d, dv: n * (d + dv),
                resident=lambda m, n, d, dv: m * d, live=lambda m, n, d, dv: m * n + m * dv),
    # dK/dV streams Q and dO, keeps K and V; lives: scores n x m, dK n x d, dV n x dv.
    "bwd_dkdv": dict(rows=lambda m, n: n, streamed=lambda m, n, d, dv: m * (d + dv),
                     resident=lambda m, n, d, dv: n * (d + dv),
                     live=lambda m, n, d, dv: n * m + n * (d + dv)),
    # dQ streams K and V, keeps Q and dO; lives: scores m x n, dQ m x d.
    "bwd_dq": dict(rows=lambda m, n: m, streamed=lambda m, n, d, dv: n * (d + dv),
                   resident=lambda m, n, d, dv: m * (d + dv),
                   live=lambda m, n, d, dv: m * n + m * d),
}
prune_fwd = _pruner(*_RULES, **_SHAPES["fwd"])
prune_bwd_dkdv = _pruner(*_RULES, **_SHAPES["bwd_dkdv"])
prune_bwd_dq = _pruner(*_RULES, **_SHAPES["bwd_dq"])


# -- pinned mode -------------------------------------------------------------------------------
SPACES = {"fwd": FWD_CONFIGS, "bwd_dkdv": BWD_DKDV_CONFIGS, "bwd_dq": BWD_DQ_CONFIGS}
"""Tuning space of each autotuned kernel (forward, fp8 forward included; dK/dV; dQ)."""

PINNED_REFERENCE = {
    "fwd": BlockConfig(block_m=128, block_n=64, num_warps=8, num_stages=3),
    "bwd_dkdv": BlockConfig(block_m=32, block_n=128, num_warps=8, num_stages=3),
    "bwd_dq": BlockConfig(block_m=128, block_n=32, num_warps=8, num_stages=3),
}
"""Pinned mode's first choice per kernel: the Triton fused-attention tutorial's Hopper tile
shapes (128 x 64 forward, 32 x 128 dK/dV, 128 x 32 dQ) with two warpgroups (8 warps: the 128
rows prune_idle_warpgroups asks of them) and a 3-deep pipeline -- compile_check's performance
target, compiled for sm_90 without spills under triton 3.6 and 3.9 (bf16 d128; the evidence is
beside MAX_SPILL_BYTES in tests/kernels/test_triton_kernels.py). 4 stages would spill 24 B in dK/dV
under 3.6."""

# The rules that do not depend on the call's lengths: a pinned config must serve every length.
# (prune_tiles_longer_than_sequence is left out: a 128-row tile over a 77-token sequence only
# computes masked padding.)
_LENGTH_FREE_RULES = (prune_shared_memory, prune_register_spills, prune_idle_warpgroups)
_PINNED_PRUNE = {kind: _pruner(*_LENGTH_FREE_RULES, **shape) for kind, shape in _SHAPES.items()}


def pick_tutorial_tile_else_leanest(survivors: list[triton.Config], reference: BlockConfig,
                                    live: Callable[[BlockConfig], float]) -> BlockConfig:
    """The pinned rule: ``reference`` when the length-free pruning rules keep it; else the
    survivor with the fewest live fp32 values per thread (``live``, the register rule's own
    estimate: where the reference does not fit, registers are what spills next), then the
    largest tile (fewest passes over the streamed operands), then the fewest stages (each is
    one more buffer, and registers for its loads). Measured on sm_90 at d256 (bf16), where
    the reference tiles fall: forward 64 x 64 / 8 warps spills 0 B with 2 stages, 160 B with
    3; dK/dV 32 x 64 spills 344 B where the larger 64 x 64 spills 568 B (triton 3.9)."""
    picks = [BlockConfig.of(c) for c in survivors]
    if reference in picks:
        return reference
    return min(picks, key=lambda c: (live(c), -c.block_m * c.block_n, c.num_stages))


def pinned_config(kind: str, flags: dict[str, Any]) -> BlockConfig:
    """The one config pinned mode launches ``kind`` (fwd, bwd_dkdv, bwd_dq) with, for the
    constexprs in ``flags`` that decide it: BLOCK_D, BLOCK_DV (padded head dims) and
    DOT_PRECISION (fp32 inputs need twice the shared memory). Independent of lengths, heads
    and features, so one variant compiles one kernel."""
    return _pinned(kind, flags["BLOCK_D"], flags["BLOCK_DV"], flags.get("DOT_PRECISION", "tf32"),
                   _shared_memory_budget())


@functools.lru_cache(maxsize=64)
def _pinned(kind: str, block_d: int, block_dv: int, precision: str, budget: int) -> BlockConfig:
    del budget  # a cache key only: the rules read the device's budget themselves
    survivors = _PINNED_PRUNE[kind](SPACES[kind], dict(BLOCK_D=block_d, BLOCK_DV=block_dv,
                                                       DOT_PRECISION=precision))
    shape = _SHAPES[kind]["live"]
    return pick_tutorial_tile_else_leanest(
        survivors, PINNED_REFERENCE[kind],
        lambda c: shape(c.block_m, c.block_n, block_d, block_dv) / (32 * c.num_warps))


def kernel_config_mode() -> str:
    """``autotune`` or ``pinned``, from ATTNBENCH_KERNEL_CONFIGS (read at every launch, so a
    case runner may set it per case); anything else is a ValueError naming the variable."""
    mode = os.environ.get(ENV_KERNEL_CONFIGS) or "autotune"
    if mode not in KERNEL_CONFIG_MODES:
        raise ValueError(f"{ENV_KERNEL_CONFIGS}={mode!r}: expected one of "
                         f"{', '.join(KERNEL_CONFIG_MODES)}")
    return mode
