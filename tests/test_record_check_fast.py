"""check_record's fast path (results/schema.py ``_fits``) and check_case_dict's memo of checked
values (sweep/case.py ``_CHECKED``): issue 29's readers check 10^6 records, so a record that
passes builds no message; one that does not goes the slow way, which names its field. The
rule: the fast path passes only what the slow one passes (else a bad record would be read as
good), and the memo returns what the rule returned for that very value."""

from __future__ import annotations

import copy

import pytest

import attnbench.results.schema as schema
import attnbench.sweep.case as case_module
from attnbench.errors import RunDirError, SweepError
from attnbench.results.schema import check_record
from attnbench.sweep.case import check_case_dict, make_case
from helpers import simulated_record

WRONG = (True, False, 0, -1, 1.5, "x", "", [], [1.5], [True], ["x"], {}, {"a": 1}, None)
"""A value of every JSON kind (and the bools a NUMBER must refuse): planted in each field."""


def _full_record() -> dict:
    """A record with every section the schema reads filled, so every table is reached."""
    rec = simulated_record(make_case("fast", {"backend": "naive", "dtype": "bf16", "seed": 3}))
    rec["checks"] = [{"check": "reference", "tensor": "dq", "metric": "rel_l2", "value": 0.1,
                      "bound": 0.2, "passed": True, "note": "n"}]
    rec["crash"] = {"signal": "SIGSEGV", "stderr_tail": "t", "traceback": "tb", "exit_code": -11,
                    "rank": 0}
    rec["compile"] = {"mode": "pinned", "interpreted": False, "variant": "v", "seconds": 1.0,
                      "kernels": 2, "configs": {"_attn_fwd": {"BLOCK_M": 64, "num_warps": 4}}}
    metrics = {"rel_l2": 0.1, "max_abs": 0.2, "bound": 0.3, "ratio": 1.0}
    rec["accuracy"] = {"reference": "exact", "tensors": {"out": dict(metrics)},
                       "identities": {"dv_v": {"value": 0.1, "bound": 0.2}},
                       "parity": {"dq": dict(metrics)}}
    rec["timing"]["fwd"]["samples_ms"] = [1.0, 2, 3.5]
    rec["env"]["identity"] = {"name": "H100", "sm_count": 132, "ecc_enabled": True}
    rec["env"]["software"] = {"torch": "2.5", "dirty": False}
    return rec


def _paths(value, prefix=()):
    """Every (path, leaf) of a record: where a wrong value may be planted."""
    if isinstance(value, dict):
        for key, v in value.items():
            yield prefix + (key,), v
            yield from _paths(v, prefix + (key,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield prefix + (i,), v
            yield from _paths(v, prefix + (i,))


def _planted(rec: dict, path: tuple, value) -> dict:
    out = copy.deepcopy(rec)
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


def _slow_passes(rec) -> bool:
    try:
        schema._check_record("j:1: ", rec)
    except RunDirError:
        return False
    return True


def _fast_passes(rec) -> bool:
    try:
        return schema._fits(rec)
    except SweepError:
        return False


def test_a_full_record_passes_the_fast_way():
    # Mutant: a table compiled from the wrong kinds (TEXT as NUMBER): every record goes slow.
    rec = _full_record()
    assert _fast_passes(rec) and check_record("j:1: ", rec) is rec


def test_the_fast_path_passes_no_wrong_value_the_slow_one_refuses():
    # Mutants this catches (each tried by hand, each caught here): a table left out of _fits
    # (env.identity, compile.configs, timing.bwd), NUMBER's exact types with bool, checks'
    # items not looked at, attempt 0 let through, an id of 65 characters.
    rec = _full_record()
    tried = refused = 0
    for path, _ in list(_paths(rec)) + [(("id",), None), (("attempt",), None)]:
        for value in WRONG + ("x" * 65, 0):
            bad = _planted(rec, path, value)
            slow = _slow_passes(bad)
            tried += 1
            refused += not slow
            if not slow:
                assert not _fast_passes(bad), (path, value)
                with pytest.raises(RunDirError) as fast_message:
                    check_record("j:1: ", bad)
                with pytest.raises(RunDirError) as slow_message:
                    schema._check_record("j:1: ", bad)
                assert str(fast_message.value) == str(slow_message.value)
            else:  # passed either way: the same record back
                assert check_record("j:1: ", bad) is bad
    assert tried > 1000 and refused > 300, (tried, refused)  # the planting reached the tables


def test_a_str_subclass_goes_the_slow_way_and_passes():
    class Text(str):
        pass

    rec = _full_record()
    rec["label"] = Text("a label")
    assert not _fast_passes(rec) and check_record("", rec) is rec


@pytest.mark.parametrize("field, first, second", [
    ("batch", 1, True),         # True == 1: a memo keyed on the value alone passes a bool
    ("dropout", 0.0, -0.0),     # -0.0 == 0.0: the Case (and its id) must keep the sign
    ("dropout", -0.0, 0.0),
    ("seqlen_q", 512, 512.0),   # an integer field given a float
])
def test_the_memo_tells_values_equal_in_python_apart(field, first, second):
    case_module._CHECKED.clear()
    base = make_case("memo", {"backend": "naive"}).to_dict()
    check_case_dict("c", {**base, field: first})
    try:
        case = check_case_dict("c", {**base, field: second})
    except SweepError:
        assert isinstance(second, (bool, float)) and field in ("batch", "seqlen_q")
        return
    assert repr(getattr(case, field)) == repr(float(second)), (field, second)


def test_the_memo_is_bounded():
    # Mutant: no clearing: a journal of 10^6 distinct seeds keeps 10^6 entries.
    case_module._CHECKED.clear()
    base = make_case("memo", {"backend": "naive"}).to_dict()
    for seed in range(case_module._CHECKED_MAX + 10):
        check_case_dict("c", {**base, "seed": seed})
    assert len(case_module._CHECKED) <= case_module._CHECKED_MAX


def test_a_refused_value_is_not_remembered_as_passed():
    case_module._CHECKED.clear()
    base = make_case("memo", {"backend": "naive"}).to_dict()
    for _ in range(2):  # the second time too, with its message
        with pytest.raises(SweepError, match=r"^c\.cp: got 0, expected a positive integer"):
            check_case_dict("c", {**base, "cp": 0})
