"""The rules of fp8 cases (``dtype: fp8_e4m3 | fp8_e5m2``, ``fp8_scaling``), checked when a case
is made.

An fp8 case gives the backend q, k and v quantized to fp8 with their descales (FA3's
``descale_q/k/v``; :mod:`attnbench.problem.fp8`) and takes its output in
:data:`attnbench.dtypes.FP8_OUTPUT`. It is a forward on one device without dropout:
FlashAttention-3's fp8 path has no backward and no dropout, and ours (:mod:`attnbench.kernels`)
is the same; multi-rank fp8 (descales of a head slice, an fp8 ring) and an fp8 KV cache for
decode are not built yet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attnbench.dtypes import FP8_DTYPES, FP8_WGMMA_K, is_fp8
from attnbench.errors import SweepError
from attnbench.validation import fail

if TYPE_CHECKING:
    from attnbench.sweep.case import Case

FP8_SCALINGS = ("tensor", "head")
"""One descale per tensor, or one per (batch row, KV head) -- FA3's ``descale_q`` layout."""
MAX_FP8_PROMOTION = 256
"""The longest promotion interval a case may ask for: past a key block's 64 (or a head dim's 256)
products a dot promotes once at its end, so larger values change nothing."""
_FP8_FIXED = {"dropout": 0.0, "cp": 1, "tp": 1, "decode": False}
_WHY = {"dropout": "no fp8 attention kernel here takes dropout (FA3's fp8 path has none)",
        "cp": "fp8 cases run on one device", "tp": "fp8 cases run on one device",
        "decode": "an fp8 KV cache is not built yet"}


def default_backward(v: dict[str, Any]) -> None:
    """An fp8 case is forward only unless the sweep says otherwise (then it is refused below)."""
    if is_fp8(v.get("dtype", "")) and "backward" not in v:
        v["backward"] = False


def check_fp8(where: str, case: "Case") -> None:
    def bad(name: str, given: Any, expected: str) -> SweepError:
        return fail(f"{where}: {name}", given, expected)

    if not is_fp8(case.dtype):
        if case.fp8_scaling != "tensor":
            raise bad("fp8_scaling", case.fp8_scaling,
                      f"tensor (the default) unless dtype is one of {', '.join(FP8_DTYPES)}")
        if case.fp8_promotion:
            raise bad("fp8_promotion", case.fp8_promotion,
                      f"0 (the default) unless dtype is one of {', '.join(FP8_DTYPES)}")
        return
    if 0 < case.fp8_promotion < FP8_WGMMA_K:
        raise bad("fp8_promotion", case.fp8_promotion,
                  f"0 (the kernel's default) or a power of two in [{FP8_WGMMA_K}, "
                  f"{MAX_FP8_PROMOTION}] (one fp8 wgmma sums {FP8_WGMMA_K} products)")
    if case.backward:
        raise bad("backward", True, "false for an fp8 case (fp8 attention is forward only "
                  "here: FA3's fp8 path and ours have no backward)")
    for name, value in _FP8_FIXED.items():
        if getattr(case, name) != value:
            raise bad(name, getattr(case, name), f"{value} for an fp8 case ({_WHY[name]})")

