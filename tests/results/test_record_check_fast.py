"""check_record's fast path (results/schema.py ``_fits``, its memo of object shapes) and the
values check_case_dict passed (sweep/case.py ``case_dict_passes``): issue 29's readers check 10^6 records, so a record that
passes builds no message; one that does not goes the slow way, which names its field. The
rule: the fast path passes only what the slow one passes (else a bad record would be read as
good), and a memo knows a value good only where its rule passed that very value."""

from __future__ import annotations

import copy
import json
import math

import pytest

import attnbench.results.schema as schema
import attnbench.sweep.case as case_module
from attnbench.errors import RunDirError, SweepError
from attnbench.results.schema import check_record
from attnbench.sweep.case import case_dict_passes, check_case_dict, make_case
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
    ("seqlen_q", 512, 512.0),   # an integer field given a float
    ("dtype", "bf16", "BF16"),
    ("cp", 2, 128),             # over MAX_RANKS
])
def test_a_value_passed_before_does_not_pass_its_look_alike(field, first, second):
    case_module._PASSED.clear()
    base = make_case("memo", {"backend": "naive"}).to_dict()
    check_case_dict("c", {**base, field: first})
    assert case_dict_passes({**base, field: first})
    assert not case_dict_passes({**base, field: second})
    with pytest.raises(SweepError, match=f"^c.{field}: got "):
        check_case_dict("c", {**base, field: second})


def test_the_case_relations_are_kept():
    # Mutant: case_dict_passes without its cp * tp bound: cp=8, tp=16 (each passed alone) read
    # as good.
    case_module._PASSED.clear()
    base = make_case("memo", {"backend": "naive"}).to_dict()
    check_case_dict("c", {**base, "cp": 8})
    check_case_dict("c", {**base, "tp": 16})
    assert not case_dict_passes({**base, "cp": 8, "tp": 16})
    with pytest.raises(RunDirError, match=r"case\.cp: got 8, expected cp \* tp <= 64"):
        check_record("j:1: ", {**_full_record(), "case": {**base, "cp": 8, "tp": 16}})
    # packed lengths are never known alone: checked against batch and seqlen_q each time
    packed = {**base, "batch": 2, "seqlen_q": 512, "seqlen_kv": 512, "seqlens_q": [384, 128],
              "seqlens_kv": [384, 128]}
    check_case_dict("c", packed)
    assert not case_dict_passes(packed)
    # Mutant: lengths remembered when hashable (a case made in memory holds tuples): lengths
    # of a good 2-sequence pack then pass with batch 3.
    check_case_dict("c", {**base, "batch": 3})
    tuples = {**packed, "seqlens_q": (384, 128), "seqlens_kv": (384, 128)}
    check_case_dict("c", tuples)
    assert not case_dict_passes({**tuples, "batch": 3})
    assert not case_dict_passes({**base, "backend2": "naive"})  # a field it does not know
    assert case_dict_passes(base) and not case_dict_passes({**base, "backend": "other"})


def test_the_memos_are_bounded():
    # Mutant: no clearing: a journal of 10^6 distinct seeds keeps 10^6 values (or shapes).
    case_module._PASSED.clear()
    base = make_case("memo", {"backend": "naive"}).to_dict()
    for seed in range(case_module._PASSED_MAX + 10):
        check_case_dict("c", {**base, "seed": seed})
    assert len(case_module._PASSED) <= case_module._PASSED_MAX
    rec = _full_record()
    for i in range(schema._SHAPES_MAX + 10):
        rec["env"] = {"host": "h", f"extra{i}": 1}
        check_record("", rec)
    assert len(schema._SHAPES) <= schema._SHAPES_MAX


def test_a_refused_value_is_not_remembered_as_passed():
    case_module._PASSED.clear()
    base = make_case("memo", {"backend": "naive"}).to_dict()
    for _ in range(2):  # the second time too, with its message
        with pytest.raises(SweepError, match=r"^c\.cp: got 0, expected a positive integer"):
            check_case_dict("c", {**base, "cp": 0})
        assert not case_dict_passes({**base, "cp": 0})


def test_a_shape_seen_passing_still_has_its_lists_read():
    # Mutant: the list of numbers (samples_ms) judged by the shape alone (its type, list).
    rec = _full_record()
    check_record("", rec)
    rec["timing"]["fwd"]["samples_ms"] = [1.0, "x"]
    with pytest.raises(RunDirError, match=r"timing\.fwd\.samples_ms: got \[1\.0, 'x'\]"):
        check_record("", rec)


def _parse_json_of(data: bytes):
    from attnbench.validation import parse_json

    try:
        return "value", parse_json(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        return type(exc).__name__, str(exc)


def _parse_line_of(data: bytes, plain=None):
    from attnbench.results.journal import parse_line

    try:
        return "value", parse_line(data, plain)
    except (ValueError, UnicodeDecodeError) as exc:
        return type(exc).__name__, str(exc)


NUMBERS = ["0", "-0", "-0.0", "1e308", "1e309", "-1e309", "1E400", "1e+309", "1e+0309", "1e-400",
           "1.7976931348623157e+308", "1.8e308", "9223372036854775807", "9223372036854775808",
           "-9223372036854775808", "-9223372036854775809", "12345678901234567890.5",
           "0.00012345678901234567", "1" + "0" * 400, "1" + "0" * 5000, "NaN", "-Infinity",
           "Infinity", "1.5e-05", "123456789012345678", "0.1e99", "[1e999]", '"1e999"',
           '"12345678901234567890"', "1.0", "true", "null"]


def _plain_parsers():
    """The plain parsers a journal line may meet: orjson's (where installed) and json's."""
    from attnbench.results import journal

    return [pytest.param(None, id="installed"), pytest.param(journal._plain, id="json")]


@pytest.mark.parametrize("plain", _plain_parsers())
@pytest.mark.parametrize("number", NUMBERS)
@pytest.mark.parametrize("shape", ['{"a":%s}', '{"a": [1, %s]}', ' {"a":%s}', '[%s]', '%s',
                                   '{"s":"NaN","a":%s,"b":NaN}', '{"a":%s,"b":1e999}'])
def test_a_line_parses_as_parse_json_parses_it(shape, number, plain):
    # Mutants caught here: no check for long integers (2**63 passes; orjson reads
    # -9223372036854775809 as a float), or for exponents (1e309 is inf), the blank before a
    # long integer left out ("-9223372036854775809"), NaN let through by the plain decoder
    # (parse_constant=float).
    data = (shape % number).encode()
    assert _parse_line_of(data, plain) == _parse_json_of(data)


@pytest.mark.parametrize("plain", _plain_parsers())
def test_lines_of_random_numbers_parse_as_parse_json_parses_them(plain):
    import random

    rng = random.Random(29)
    pieces = ["1", "9", "0", ".", "e", "E", "+", "-", "5"]
    for _ in range(3000):
        number = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 30)))
        data = f'{{"x": {number}, "y": [{rng.random() * 10 ** rng.randint(-30, 30)}]}}'.encode()
        assert _parse_line_of(data, plain) == _parse_json_of(data), data
    for bad in (b'{"a": "\xff"}', b'{"a": 1', b"{" * 100_000, b'{"a": "\\ud800"}',
                b'{"a": "\xed\xa0\x80"}', b'{"a": "\\udc00\\ud800"}', b'\xef\xbb\xbf{"a": 1}',
                b'{"a": 1, "a": 2}', b'{"a": 1}\x0c', b'{"a": "x\x01"}', b'{"a": [1,]}'):
        assert _parse_line_of(bad, plain) == _parse_json_of(bad), bad


@pytest.mark.parametrize("plain", _plain_parsers())
def test_random_floats_and_texts_parse_to_the_same_bits(plain):
    # orjson's float and string parsers against json's: the same bits for every float as
    # written by repr and by %e with 12-25 digits, the same text for every string (escaped or
    # not, astral, control characters); a parser that rounds once more differs here.
    import random
    import struct

    rng = random.Random(2029)
    for _ in range(2000):
        x = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        if x != x or abs(x) == math.inf:
            continue
        text = "".join(chr(rng.choice([rng.randint(0, 0x7F), rng.randint(0x80, 0xD7FF),
                                       rng.randint(0xE000, 0x10FFFF)])) for _ in range(8))
        for digits in (repr(x), f"{x:.17e}", f"{x:.25g}", f"{x:.12e}"):
            for ascii_only in (True, False):
                data = ('{"x": %s, "t": %s}' % (digits, json.dumps(text, ensure_ascii=ascii_only))
                        ).encode("utf-8")
                (kind, got), (wanted, want) = _parse_line_of(data, plain), _parse_json_of(data)
                assert kind == wanted, data  # both refuse "%.25g" of 1e20 (beyond int64)
                if kind == "value":
                    assert got["t"] == want["t"] and type(got["x"]) is type(want["x"]), data
                    assert struct.pack("<d", got["x"]) == struct.pack("<d", want["x"]), data


def test_orjson_parses_the_journal_where_installed():
    orjson = pytest.importorskip("orjson")
    from attnbench.results import journal

    assert journal._plain_loads is orjson.loads
