"""The fp8 panel's speed-up pairs an fp8 case with the bf16 case of the same problem: every case
field but :data:`~attnbench.report.page.panels.fp8.PAIR_FREE` (dtype, fp8_scaling, fp8_promotion,
backward, gpu) must match. The pairs' keys are derived from the ``Case`` dataclass (issue 38); the
hand-kept list they replace lacked six fields and timed an fp8 case against the median of bf16
cases of other world sizes -- kept below as the mutant."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

import attnbench.report.page.panels.fp8 as fp8
from attnbench.sweep.case import CASE_FIELDS, Case

HAND_KEPT = ("backend", "batch", "seqlen_q", "seqlen_kv", "seqlens_q", "seqlens_kv", "heads_q",
             "heads_kv", "head_dim", "head_dim_v", "mask", "window_left", "window_right", "bias",
             "softcap", "inputs", "seed", "gpu_kind")
"""PAIR_KEYS as it was written by hand before issue 38: the mutant."""


def _row(dtype: str, ms: float, **fields) -> dict:
    case = dataclasses.asdict(Case(backend="triton", dtype=dtype, backward=False))
    return {**case, **fields, "gpu_kind": "H100", "verdict": "pass", "fwd_median_ms": ms}


def _speedup(*rows: dict) -> list[float]:
    return sorted(fp8.speedups(pd.DataFrame(rows)).speedup)


def test_the_twin_is_the_bf16_case_of_the_same_problem():
    assert _speedup(_row("fp8_e4m3", 1.0), _row("bf16", 2.0)) == [2.0]


def test_fp8_scaling_backward_and_the_sweeps_gpu_may_differ():
    assert _speedup(_row("fp8_e4m3", 1.0, fp8_scaling="head"),
                    _row("bf16", 2.0, backward=True, gpu="H100")) == [2.0]


@pytest.mark.parametrize("field", [f for f in CASE_FIELDS if f not in fp8.PAIR_FREE])
def test_a_bf16_case_that_differs_in_any_other_field_is_no_twin(field):
    assert _speedup(_row("fp8_e4m3", 1.0), _row("bf16", 2.0, **{field: "another"})) == []


def test_a_bf16_case_of_another_world_size_does_not_move_the_speedup():
    assert _speedup(_row("fp8_e4m3", 1.0), _row("bf16", 2.0), _row("bf16", 20.0, cp=2),
                    _row("bf16", 30.0, tp=2, dropout=0.1)) == [2.0]


def test_the_hand_kept_keys_are_caught(monkeypatch):
    # The mutant pairs across the six fields it lacks: the speed-up becomes the median of
    # 2, 20 and 30 ms over 1 ms.
    monkeypatch.setattr(fp8, "PAIR_KEYS", HAND_KEPT)
    assert _speedup(_row("fp8_e4m3", 1.0), _row("bf16", 2.0), _row("bf16", 20.0, cp=2),
                    _row("bf16", 30.0, tp=2, dropout=0.1)) == [20.0]
    missed = [f for f in CASE_FIELDS if f not in fp8.PAIR_FREE
              and _speedup(_row("fp8_e4m3", 1.0), _row("bf16", 2.0, **{f: "another"}))]
    # (and every field added since: captured, issue 42)
    assert missed == ["dropout", "cp", "cp_algo", "tp", "decode", "page_size", "captured"]
