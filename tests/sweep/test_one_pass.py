"""``attnbench validate`` finds every mistake in one pass (issue 40 item 3): field mistakes no
longer hide case mistakes or the backend look, a ``module:object`` is looked up in its source
(never run), a misspelt enum value gets a hint, and a cause many cases share is one line.

Each test fails on the code before it (9bb7f05): there a field mistake stopped the reading
before the product was expanded, the importable look ran only once the sweep was valid, and
looked for the module only."""

from __future__ import annotations

import sys

import pytest

from attnbench import cli
from attnbench.backends import check_backend_name
from attnbench.errors import SweepError
from attnbench.sweep.load import parse_sweep


def _lines(text: str, *overrides: str) -> list[str]:
    with pytest.raises(SweepError) as info:
        parse_sweep(text, "bad.yaml", check_backend_name, overrides)
    return str(info.value).split("\n")


def _validate(tmp_path, monkeypatch, capsys, text: str) -> tuple[int, list[str]]:
    (tmp_path / "s.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)  # where validate looks for a module, as a rank would
    status = cli.main(["validate", "s.yaml"])
    return status, capsys.readouterr().err.strip().splitlines()


# -- field mistakes do not hide case mistakes ----------------------------------------------------

def test_a_field_mistake_and_a_case_mistake_come_together():
    # Before: only the mask line (the product was never expanded).
    lines = _lines("name: t\ndefaults: {heads_q: 4, heads_kv: 3}\n"
                   "axes: {backend: [naive], mask: [none, casual]}\n")
    assert len(lines) == 2, lines
    assert lines[0].startswith("bad.yaml: axes.mask[1]: got 'casual'")
    assert lines[1] == ("bad.yaml: axes(backend=naive, mask=none): heads_kv: got 3, expected a "
                        "divisor of heads_q=4 (GQA groups must be whole)")


def test_a_wrong_default_still_lets_the_other_fields_be_checked():
    lines = _lines("name: t\ndefaults: {backend: naive, heads_q: 4, heads_kv: 3, dtype: bf61}\n")
    assert any("defaults.dtype: got 'bf61'" in line for line in lines)
    assert any("heads_kv: got 3, expected a divisor of heads_q=4" in line for line in lines)


GENUINE = "include: [{backend: naive, heads_q: 6, heads_kv: 4}]\n"
"""A case mistake the sweep does make, beside each field mistake below: it must show."""
GENUINE_LINE = ("bad.yaml: include[0]: heads_kv: got 4, expected a divisor of heads_q=6 (GQA "
                "groups must be whole)")


@pytest.mark.parametrize("text, invented", [
    # heads_q's value was wrong: a case built with the table's heads_q would be judged by a
    # heads_q the sweep never gave.
    ("defaults: {backend: naive, heads_q: eight, heads_kv: 3}\n", "divisor of heads_q=8"),
    # the backend's value was wrong: no case is "missing" its backend.
    ("defaults: {backend: flashy, heads_q: 8}\n", "backend: missing"),
    # a misspelt axes key: the field it meant is unknown, as if its default were wrong
    ("defaults: {backend: naive, heads_kv: 3}\naxes: {heads: [6]}\n", "divisor of heads_q=8"),
    # all of an axis's values were wrong: the product is empty, no exclude is "unused"
    ("defaults: {backend: naive}\naxes: {seqlen_q: [x]}\nexclude: [{seqlen_q: 64}]\n",
     "exclude[0]"),
    # a zipped point with a wrong value is left out whole, not built half (heads_kv=3 with
    # the table's mask), and the exclude that matched only it is not "unused"
    ("defaults: {backend: naive, heads_q: 4}\naxes:\n  g: {zip: {heads_kv: [2, 3], mask: "
     "[none, casual]}}\nexclude: [{heads_kv: 3}]\n", "exclude[0]"),
    # a broken exclude may remove the case that fails: that case is not checked
    ("defaults: {backend: naive, heads_q: 4}\naxes: {heads_kv: [2, 3]}\n"
     "exclude: [{heads_kv: 3, mask: casual}]\n", "heads_kv: got 3"),
])
def test_case_mistakes_come_with_field_mistakes_and_none_is_invented(text, invented):
    # Before: the field mistake alone (GENUINE_LINE missing).
    lines = _lines("name: t\n" + text + GENUINE)
    assert GENUINE_LINE in lines and len(lines) == 2, lines
    assert not any(invented in line for line in lines), lines


def test_a_misspelt_section_expands_nothing():
    # The cases would lack all that the misspelt section says: none is checked.
    assert _lines("name: t\naxis: {backend: [naive]}\n" + GENUINE) == [
        "bad.yaml: axis: unknown key 'axis' (did you mean axes?), expected one of name, "
        "description, defaults, axes, exclude, include, options"]


def test_many_cases_that_fail_alike_are_one_line_with_their_count():
    # Before: 40 lines, one per case, cut at 30 with "... more mistakes like these".
    lines = _lines("name: t\ndefaults: {backend: naive, heads_q: 4, heads_kv: 3}\n"
                   "axes: {seqlen_q: {range: [1, 40]}}\n")
    assert len(lines) == 1, lines
    assert lines[0] == ("bad.yaml: heads_kv: got 3, expected a divisor of heads_q=4 (GQA groups "
                        "must be whole) (40 cases: axes(seqlen_q=1), axes(seqlen_q=2), ...)")


def test_causes_that_differ_stay_apart():
    lines = _lines("name: t\ndefaults: {backend: naive, heads_kv: 3}\n"
                   "axes: {heads_q: [4, 8], seqlen_q: [16, 32]}\n")
    assert [line.split(" (2 cases")[0] for line in lines] == [
        f"bad.yaml: heads_kv: got 3, expected a divisor of heads_q={h} (GQA groups must be whole)"
        for h in (4, 8)]


def test_a_good_sweep_reads_as_before():
    sweep = parse_sweep("name: t\ndefaults: {backend: naive, heads_q: 4}\n"
                        "axes: {heads_kv: [1, 2, 4], mask: [none, causal]}\n"
                        "exclude: [{heads_kv: 1, mask: causal}]\n", "t.yaml", check_backend_name)
    assert len(sweep.cases) == 5


# -- hints for misspelt values --------------------------------------------------------------------

@pytest.mark.parametrize("field, value, hint", [
    ("mask", "casual", "(did you mean causal?)"),
    ("mask", "{windwo: 64}", "(did you mean {window: W}?)"),
    ("dtype", "bfloat61", "(did you mean bfloat16?)"),  # an alias, accepted as bf16
    ("fp8_scaling", "per_haed", "(did you mean head?)"),  # a word of it, misspelt
])
def test_a_misspelt_value_gets_a_hint(field, value, hint):
    (line,) = _lines(f"name: t\naxes: {{backend: [naive], {field}: [{value}]}}\n")
    assert line.startswith(f"bad.yaml: axes.{field}[0]: got ") and line.endswith(hint), line


def test_no_hint_for_a_value_far_from_every_choice():
    (line,) = _lines("name: t\naxes: {backend: [naive], mask: [diagonal]}\n")
    assert "did you mean" not in line


# -- module:object backends, looked up without running them --------------------------------------

USER_MODULE = """open("module-ran", "w")  # a check of a sweep must never run this
import os as _os

class MyBackend:
    pass

if _os.sep:
    make_backend = MyBackend
"""


def test_validate_finds_a_misspelt_object_with_a_hint_and_runs_nothing(tmp_path, monkeypatch,
                                                                         capsys):
    (tmp_path / "mybackend.py").write_text(USER_MODULE)
    status, lines = _validate(tmp_path, monkeypatch, capsys, (
        "name: t\ndefaults: {heads_q: 4}\naxes:\n  backend: [naive, 'mybackend:MyBakend', "
        "'mybackend:MyBackend', 'mybackend:make_backend']\n"))
    assert status == 2 and len(lines) == 1, lines
    assert lines[0].startswith("attnbench: error: s.yaml: axes.backend[1]: backend "
                               "'mybackend:MyBakend': module 'mybackend' (")
    assert "binds no top-level name 'MyBakend' (did you mean MyBackend?)" in lines[0]
    assert not (tmp_path / "module-ran").exists() and "mybackend" not in sys.modules


def test_validate_looks_for_the_module_even_when_a_field_is_wrong(tmp_path, monkeypatch, capsys):
    # Before: the dropout line alone; the missing module showed only once it was fixed.
    status, lines = _validate(tmp_path, monkeypatch, capsys, (
        "name: t\ndefaults: {dropout: 2}\naxes: {backend: [naive, 'nosuchmod_xyz:Backend']}\n"))
    assert status == 2 and len(lines) == 2, lines
    assert "s.yaml: defaults.dropout: got 2" in lines[0]
    assert "s.yaml: axes.backend[1]: backend 'nosuchmod_xyz:Backend': module 'nosuchmod_xyz' " \
           "is not importable" in lines[1] and "PYTHONPATH" in lines[1]


def test_validate_accepts_what_it_cannot_tell(tmp_path, monkeypatch, capsys):
    # A module that binds names dynamically, a package's submodule, a loaded module's own name.
    (tmp_path / "dyn.py").write_text("globals()['Made'] = object\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub.py").write_text("")
    status, lines = _validate(tmp_path, monkeypatch, capsys, (
        "name: t\naxes: {backend: ['dyn:Made', 'pkg:sub', 'os:getcwd']}\n"))
    assert status == 0, lines


def test_a_cause_shared_by_a_huge_product_costs_linear_time():
    # A list of every failing case, searched on each add (the first version), took 102 s for
    # 10^5 failing cases; kept bounded, 2 x 10^5 adds take ~0.3 s. Margin: > 100x.
    import time

    from attnbench.sweep.one_pass import SharedCauses
    from attnbench.validation import Problems

    causes, problems = SharedCauses(), Problems("big.yaml")
    t0 = time.perf_counter()
    for i in range(200_000):
        causes.add(f"axes(seqlen_q={i})", SweepError(f"axes(seqlen_q={i}): heads_kv: got 3"))
    causes.report(problems)
    assert time.perf_counter() - t0 < 10
    assert problems.messages == ["heads_kv: got 3 (200000 cases: axes(seqlen_q=0), "
                                 "axes(seqlen_q=1), ...)"]
