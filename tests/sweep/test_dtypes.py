"""The dtype declarations (attnbench.dtypes) against what reads them: every name and alias goes
through a sweep to its name, every torch name resolves to a dtype of the declared size and (fp8)
grid, and a wrong declaration is noticed (the checks have teeth)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from attnbench import dtypes
from attnbench.dtypes import BY_NAME, DTYPES, FP8_OUTPUT, Dtype
from attnbench.hardware.peaks import DTYPES as PEAK_COLUMNS
from attnbench.hardware.peaks import normalize_dtype, peak_tflops
from attnbench.problem.fp8 import FORMATS, output_dtype, torch_dtype
from attnbench.sweep.case import make_case
from attnbench.sweep.flops import case_bytes
from attnbench.sweep.load import parse_sweep

SPELLINGS = [(d.name, spelling) for d in DTYPES for spelling in (d.name, *d.aliases)]


def torch_mismatches(declared: dict[str, Dtype]) -> list[str]:
    """What the declarations say that torch does not: bytes per element, an fp8 grid."""
    wrong = []
    for d in declared.values():
        resolved = getattr(torch, d.torch_name)
        if torch.tensor([], dtype=resolved).element_size() != d.bytes:
            wrong.append(f"{d.name}: {d.bytes} bytes, torch.{d.torch_name} has "
                         f"{torch.tensor([], dtype=resolved).element_size()}")
        if d.fp8 is not None:
            info = torch.finfo(resolved)
            grid = (-math.log2(info.eps), math.log2(info.smallest_normal), info.max)
            if grid != (d.fp8.mantissa_bits, d.fp8.min_normal_exp, d.fp8.max_finite):
                wrong.append(f"{d.name}: grid {d.fp8}, torch.{d.torch_name} has {grid}")
    return wrong


def _sweep(dtype: str) -> str:
    return f"name: t\ndefaults: {{backend: naive, heads_q: 4, head_dim: 32, dtype: {dtype}}}\n"


@pytest.mark.parametrize("name, spelling", SPELLINGS)
def test_every_name_and_alias_goes_through_a_sweep_to_its_name(name, spelling):
    (case,) = parse_sweep(_sweep(spelling), "t.yaml").cases
    assert case.dtype == name
    assert make_case("t", case.to_dict()).id == case.id  # a record's case reads back the same


def test_names_and_aliases_are_unambiguous():
    spellings = [s for _, s in SPELLINGS]
    assert len(spellings) == len(set(spellings))
    assert list(dtypes.ALIASES) == [s for name, s in SPELLINGS if s != name]


def test_torch_agrees_with_every_declaration():
    assert torch_mismatches(BY_NAME) == []
    for d in DTYPES:
        assert torch_dtype(d.name) == getattr(torch, d.torch_name)
        assert output_dtype(d.name) == torch_dtype(d.output)
    assert {name: fmt.torch_dtype for name, fmt in FORMATS.items()} == {
        d.name: torch_dtype(d.name) for d in DTYPES if d.is_fp8}


def test_a_wrong_declaration_is_noticed(monkeypatch):
    """Mutant-style: bf16 declared 4 bytes, e4m3 declared with e5m2's largest value."""
    case = make_case("t", dict(backend="naive", heads_q=4, head_dim=32, dtype="bf16"))
    honest = case_bytes(case)[0]
    monkeypatch.setitem(BY_NAME, "bf16", dataclasses.replace(BY_NAME["bf16"], bytes=4))
    e4m3 = BY_NAME["fp8_e4m3"]
    monkeypatch.setitem(BY_NAME, "fp8_e4m3", dataclasses.replace(
        e4m3, fp8=dataclasses.replace(e4m3.fp8, max_finite=57344.0)))
    wrong = torch_mismatches(BY_NAME)
    assert len(wrong) == 2 and wrong[0] == "bf16: 4 bytes, torch.bfloat16 has 2", wrong
    assert wrong[1].startswith("fp8_e4m3: grid"), wrong
    # the work model reads the declaration (no table of its own): q, k, v, out twice the bytes
    lse = case.tensor_batch * case.heads_q * case.seqlen_q * 4
    assert case_bytes(case)[0] - lse == 2 * (honest - lse)


def test_outputs_bounds_and_families_name_declared_dtypes():
    for d in DTYPES:
        assert d.output in BY_NAME and not BY_NAME[d.output].is_fp8
        assert d.bound in BY_NAME and d.family in PEAK_COLUMNS
        assert d.output == (FP8_OUTPUT if d.is_fp8 else d.name)
        assert d.bound == d.output  # accuracy bounds follow the output dtype
    assert dtypes.FP8_DTYPES == ("fp8_e4m3", "fp8_e5m2")
    assert dtypes.FAMILIES == ("fp32", "fp16", "bf16", "fp8")


@pytest.mark.parametrize("d", DTYPES, ids=lambda d: d.name)
def test_every_spelling_finds_the_datasheet_column(d):
    for spelling in (d.name, d.torch_name, f"torch.{d.torch_name}", *d.aliases):
        assert normalize_dtype(spelling) == d.family
    assert peak_tflops("H100-SXM5-80GB", d.name) == peak_tflops("H100-SXM5-80GB", d.family)
