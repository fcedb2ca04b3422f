"""What the failing cases share (attnbench.report.read.commonality): a case-field value is named
only where every failure of a backend has it and not every case does; tensors where some were
checked and never failed; a stream and ranges merged give the same lines; memory is bounded
by the distinct values counted, not by the records (issue 39 item 7)."""

import pytest

from attnbench.report.read import commonality as common
from attnbench.report.read.commonality import Commonality, failed_tensors, tensor_of


def check(tensor, passed, kind="reference"):
    return {"check": kind, "tensor": tensor, "metric": "rel_l2", "value": 1.0, "bound": 1.0,
            "passed": passed}


def record(verdict="pass", failing=(), backend="mutant.gqa_dkv_mean", **fields):
    case = {"backend": backend, "dtype": "bf16", "heads_q": 4, "heads_kv": 4, "mask": "none",
            "seed": 0, **fields}
    checks = [check(t, t not in failing) for t in ("out", "dq", "dk", "dv")]
    checks.append(check("dv_v", "dv" not in failing, "identity"))
    return {"id": f"{len(str(fields))}", "case": case, "verdict": verdict,
            "checks": checks if verdict in ("pass", "fail") else []}


def gqa_run():
    """The planted GQA bug: dK/dV wrong where heads_kv < heads_q, 6 of 12 cases."""
    out = []
    for heads_kv in (4, 2):
        for mask in ("none", "causal"):
            for seed in range(3):
                bad = heads_kv == 2
                out.append(record("fail" if bad else "pass", ("dk", "dv") if bad else (),
                                  heads_kv=heads_kv, mask=mask, seed=seed))
    return out


def lines_of(records):
    tally = Commonality()
    for r in records:
        tally.add(r)
    return tally.lines()


def test_the_shared_value_and_the_failing_tensors_are_named():
    head, line = lines_of(gqa_run())
    assert head == "What the failing cases share:"
    assert line == ("  mutant.gqa_dkv_mean: 6 of 12 cases fail; 6 of 6 failures are heads_kv=2 "
                    "(every such case fails); only dK/dV fail; out, dQ are clean")
    # Mutants: a value every case has (dtype=bf16, heads_q=4) named; mask or seed (mixed among
    # the failures) named; the identity residual dv_v counted as a tensor of its own.
    assert "dtype" not in line and "heads_q" not in line and "mask" not in line
    assert "seed" not in line and "dv_v" not in line


def test_a_value_some_passing_cases_share_too_is_counted():
    records = gqa_run() + [record("pass", heads_kv=2, mask="none", seed=9)]
    (_, line) = lines_of(records)
    assert "heads_kv=2 (6 of 7 such cases fail)" in line


def test_nothing_shared_says_nothing_and_every_case_failing_says_so():
    mixed = [record("fail", ("dq",), heads_kv=h) for h in (4, 2)] + [record("pass", heads_kv=1)]
    (_, line) = lines_of(mixed)
    assert "failures are" not in line and "only dQ fails" in line
    assert "out, dK, dV are clean" in line
    every = [record("fail", ("out", "dq", "dk", "dv"), seed=s) for s in range(3)]
    assert lines_of(every) == ["What the failing cases share:",
                               "  mutant.gqa_dkv_mean: 3 of 3 cases fail; every case fails"]
    # every tensor failing and no value concentrated: nothing beyond the counts, no line
    broad = [record("fail", ("out", "dq", "dk", "dv"), seed=s) for s in range(2)]
    assert lines_of(broad + [record("pass", seed=5)]) == []
    assert lines_of([record("pass")]) == []


def test_deaths_name_their_verdicts_and_no_tensor():
    records = [record("crash", heads_kv=2, seed=s) for s in range(3)]
    records += [record("timeout", heads_kv=2, seed=7), record("pass", heads_kv=4)]
    (_, line) = lines_of(records)
    assert line.startswith("  mutant.gqa_dkv_mean: 4 of 5 cases fail (crash 3, timeout 1); ")
    assert "heads_kv=2 (every such case fails)" in line and "clean" not in line


def test_uneven_tensor_failures_are_counted_and_a_lone_check_kind_named():
    records = [record("fail", ("dk", "dv"), seed=0), record("fail", ("dk",), seed=1),
               record("pass", seed=2)]
    (_, line) = lines_of(records)
    assert "only dK/dV fail (dK in 2, dV in 1 of 2)" in line
    nan = [dict(record("pass", seed=s), verdict="fail") for s in range(2)]
    for r in nan:
        r["checks"].append(check("dq", False, "nonfinite"))
    (_, line) = lines_of(nan + [record("pass", seed=3)])
    assert "only dQ fails" in line and "only nonfinite checks fail" in line


def test_backends_are_described_apart_most_failures_first_and_cut():
    records = gqa_run() + [record("fail", ("dq",), backend="other", seed=s) for s in range(9)]
    records += [record("pass", backend="other", seed=20)]
    _, first, second = lines_of(records)
    assert first.startswith("  other: 9 of 10 cases fail") and "only dQ fails" in first
    assert second.startswith("  mutant.gqa_dkv_mean: 6 of 12")
    many = [r for b in range(common.BACKENDS_LISTED + 2)
            for r in (record("fail", ("dq",), backend=f"b{b}"), record("pass", backend=f"b{b}"))]
    out = lines_of(many)
    assert len(out) == 1 + common.BACKENDS_LISTED + 1
    assert out[-1] == "  ... and 2 more failing backends (attnbench show RUN --all)"


@pytest.mark.parametrize("cut", [0, 1, 5, 6, 11, 12])
def test_ranges_merged_give_the_lines_of_one_pass(cut):
    records = gqa_run() + [record("pass", heads_kv=2, seed=s) for s in range(40, 80)]
    records.insert(3, record("crash", heads_kv=2, seed=99))
    first, second = Commonality(), Commonality()
    for r in records[:cut]:
        first.add(r)
    for r in records[cut:]:
        second.add(r)
    first.merge(second)
    assert first.lines() == lines_of(records)


def test_memory_is_bounded_by_the_values_counted(monkeypatch):
    """10^4 cases of distinct seeds: the seed field stops counting past MAX_VALUES values, but
    the failures' shared seed is still named (without its count: the field has many)."""
    tally = Commonality()
    for s in range(10_000):
        tally.add(record("pass", seed=s, mask=f"m{s % 3}"))
    for _ in range(4):
        tally.add(record("fail", ("dq",), seed=123_456, mask="m0"))
    (backend,) = tally._backends.values()
    held = sum(len(c) for c in backend.values.values() if c is not None)
    assert backend.values["seed"] is None and held <= len(backend.values) * common.MAX_VALUES
    (_, line) = tally.lines()
    assert "4 of 4 failures are mask=m0 (4 of 3338 such cases fail), seed=123456;" in line


def test_hostile_records_are_bounded_and_never_raise(monkeypatch):
    monkeypatch.setattr(common, "MAX_BACKENDS", 3)
    tally = Commonality()
    tally.add({"verdict": "fail"})                      # no case: not counted
    tally.add({"case": "text", "verdict": "fail"})
    for b in range(10):
        tally.add(record("fail", backend=f"b{b}"))
    assert len(tally._backends) == 3
    weird = record("fail", backend="b0", seed=1)
    weird["checks"] = [check(f"t{i}", False) for i in range(100)] + ["x", None]
    tally.add(weird)
    tally.add(record("pass", backend="b0", seed=2, mask=[1, 2, {"a": "<b>" * 40}]))
    b0 = tally._backends["b0"]
    assert len(b0.failed) == common.MAX_TENSORS and b0.judged == 2
    assert all(len(text) <= common.VALUE_CHARS for c in b0.values.values() for text in c)
    assert tally.lines()[1].startswith("  b0: 2 of 3 cases fail")


def test_a_check_names_its_tensor():
    assert [tensor_of(n) for n in ("out", "dk", "dv_v", "dq_q", "dk_sum", "lse")] == \
        ["out", "dk", "dv", "dq", "dk", "lse"]
    assert failed_tensors(record("fail", ("dk", "dv"))) == {"dk", "dv"}


def test_a_value_nearly_every_case_has_is_not_named_and_a_spared_kind_is():
    # 25 of 39 cases fail, all GQA or MQA; 38 of the 39 have softcap 0 (odds 0.36 by chance)
    fails = [record("fail", ("dk", "dv"), heads_q=8, heads_kv=h, seed=s, softcap=0.0)
             for h in (2, 1) for s in range(12)]
    fails.append(record("fail", ("dk", "dv"), heads_q=8, heads_kv=2, seed=99, softcap=0.0))
    passes = [record("pass", heads_q=8, heads_kv=8, seed=s, softcap=0.0) for s in range(13)]
    passes.append(record("pass", heads_q=8, heads_kv=8, seed=50, softcap=30.0))
    (_, line) = lines_of(fails + passes)
    assert "softcap" not in line and "failures are" not in line, line
    # MHA and heads_kv=8 are the same 14 cases: the field the user wrote is named
    assert "no failure has heads_kv=8 (14 such cases pass)" in line and "attention" not in line


def test_an_identity_is_not_a_tensor_whose_own_checks_pass():
    r = record("fail", ("dk",))
    r["checks"].append({"check": "identity", "tensor": "dq_q", "passed": False})
    (_, line) = lines_of([r, record("pass", heads_kv=4)])
    assert "only dK fails" in line and "dQ" in line.split("only dK fails")[1], line
