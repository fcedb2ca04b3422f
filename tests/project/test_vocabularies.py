"""Vocabularies declared once (issue 38): the names a record's checks may carry, the case-field
subsets, the MHA/GQA/MQA rule, the CP algorithms and the dispatch names each have one home,
and what spells them elsewhere is checked against it here. Each rule runs on the checkout and
on a planted source that breaks it.

Homes: ``attnbench.results.records.CHECKS``; ``attnbench.sweep.case`` (``case_fields``,
``attention_kind`` / ``ATTENTION_KINDS``, ``CP_ALGOS`` / ``RING_ALGOS`` / ``Case.ring_split``);
``attnbench.resources.DISPATCHES``.
"""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest

from attnbench.resources import DISPATCHES
from attnbench.results.records import CHECKS
from attnbench.sweep.case import CASE_FIELDS, CP_ALGOS, Case, attention_kind, case_fields

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "attnbench"
HOME = "attnbench/sweep/case.py"

EVIDENCE_ONLY = {"attnbench/selftest.py": {"crash", "trend"}}
"""selftest's evidence of a catch is a check's name or one of these (a crash, an error trend)."""

FIELD_LISTS = {
    ("attnbench/report/page/panels/fp8.py", "PAIR_FREE"): "the fields an fp8 pair may differ in",
    ("attnbench/report/read/data.py", "PARITY_COLUMNS"): "what a parity row shows",
    ("attnbench/report/read/reader.py", "PARALLEL_IGNORES"): "what a multi-rank twin drops",
    ("attnbench/report/read/trends.py", "_label"): "what a series' label names",
}
"""Literal lists of four or more case fields outside sweep/case.py, each a choice of a few (not
"every field but"), with why. Any other is a hand-kept subset that a new field would miss."""
MIN_FIELDS = 4


def _sources(root: Path = PACKAGE) -> dict[str, str]:
    return {p.relative_to(root.parent).as_posix(): p.read_text()
            for p in sorted(root.rglob("*.py"))}


def _is_check_access(node: ast.AST) -> bool:
    """``x.check``, ``x["check"]`` or ``x.get("check")``."""
    if isinstance(node, ast.Attribute):
        return node.attr == "check"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "check"
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get" and bool(node.args)
            and isinstance(node.args[0], ast.Constant) and node.args[0].value == "check")


def check_names(sources: dict[str, str]) -> list[str]:
    """Names a check is made with (``Check("x", ...)``, ``{"check": "x"}``) or read by
    (``c["check"] == "x"``) that :data:`CHECKS` lacks."""
    bad = []
    for path, text in sources.items():
        allowed = set(CHECKS) | EVIDENCE_ONLY.get(path, set())
        for node in ast.walk(ast.parse(text)):
            named = []
            if isinstance(node, ast.Call) and getattr(node.func, "attr",
                                                      getattr(node.func, "id", "")) == "Check":
                named += node.args[:1] + [k.value for k in node.keywords if k.arg == "check"]
            elif isinstance(node, ast.Dict):
                named += [v for k, v in zip(node.keys, node.values)
                          if isinstance(k, ast.Constant) and k.value == "check"]
            elif isinstance(node, ast.Compare) and _is_check_access(node.left):
                for op, right in zip(node.ops, node.comparators):
                    named += (right.elts if isinstance(op, (ast.In, ast.NotIn))
                              and isinstance(right, (ast.Tuple, ast.List, ast.Set)) else [right])
            bad += [f"{path}:{n.lineno}: check {n.value!r}" for n in named
                    if isinstance(n, ast.Constant) and isinstance(n.value, str)
                    and n.value not in allowed]
    return bad


def _owner(tree: ast.Module, target: ast.AST) -> str:
    """The top-level name holding a literal: the constant it is assigned to, or the function or
    class it is written in."""
    for node in tree.body:
        if any(child is target for child in ast.walk(node)):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                return node.name
            targets = node.targets if isinstance(node, ast.Assign) else [
                getattr(node, "target", None)]
            names = [n.id for n in targets if isinstance(n, ast.Name)]
            return names[0] if names else ""
    return ""


def hand_kept_field_lists(sources: dict[str, str]) -> list[str]:
    """Literal tuples, lists and sets of :data:`MIN_FIELDS` or more case field names outside
    sweep/case.py that :data:`FIELD_LISTS` does not name."""
    bad = []
    fields = set(CASE_FIELDS)
    for path, text in sources.items():
        if path == HOME:
            continue
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                named = [e.value for e in node.elts
                         if isinstance(e, ast.Constant) and e.value in fields]
                if len(named) >= MIN_FIELDS and (path, _owner(tree, node)) not in FIELD_LISTS:
                    bad.append(f"{path}:{node.lineno}: {', '.join(named)}")
    return bad


def spelled_rules(sources: dict[str, str]) -> list[str]:
    """The MHA/GQA/MQA rule or the CP algorithms spelt out again outside sweep/case.py: a
    literal ``"MQA"``/``"GQA"``, or a literal collection of two or more CP algorithms."""
    bad = []
    for path, text in sources.items():
        if path == HOME:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Constant) and node.value in ("MQA", "GQA"):
                bad.append(f"{path}:{node.lineno}: 'MQA' or 'GQA' (attention_kind)")
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                algos = [e.value for e in node.elts
                         if isinstance(e, ast.Constant) and e.value in CP_ALGOS]
                if len(algos) >= 2:
                    bad.append(f"{path}:{node.lineno}: {algos} (CP_ALGOS, RING_ALGOS)")
            if isinstance(node, ast.MatchOr):  # case "ring" | "zigzag":
                algos = [p.value.value for p in node.patterns if isinstance(p, ast.MatchValue)
                         and isinstance(p.value, ast.Constant) and p.value.value in CP_ALGOS]
                if len(algos) >= 2:
                    bad.append(f"{path}:{node.lineno}: {algos} (CP_ALGOS, RING_ALGOS)")
    return list(dict.fromkeys(bad))  # one line per repetition


def dispatch_choices(sources: dict[str, str]) -> list[str]:
    """``choices=`` given as a literal that spells the dispatch names."""
    bad = []
    for path, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.keyword) and node.arg == "choices" \
                    and isinstance(node.value, (ast.Tuple, ast.List)):
                names = {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
                if names & set(DISPATCHES):
                    bad.append(f"{path}:{node.value.lineno}: choices {sorted(names)}")
    return bad


RULES = (check_names, hand_kept_field_lists, spelled_rules, dispatch_choices)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.__name__)
def test_the_checkout_declares_each_vocabulary_once(rule):
    assert rule(_sources()) == []


PLANTED = {
    check_names: ('if c.get("check") == "paritty":\n    pass\n', "'paritty'"),
    hand_kept_field_lists: ('PAIR_KEYS = ("backend", "batch", "seqlen_q", "heads_q", "gpu_kind")\n',
                            "backend, batch, seqlen_q, heads_q"),
    spelled_rules: ('kind = "MHA" if hq == hkv else "MQA" if hkv == 1 else "GQA"\n', "'MQA'"),
    dispatch_choices: ('p.add_argument("--dispatch", choices=("tasks", "lanes"))\n', "choices"),
}


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.__name__)
def test_each_rule_finds_its_planted_repetition(rule):
    source, expected = PLANTED[rule]
    found = rule({"attnbench/report/planted.py": source})
    assert len(found) == 1 and expected in found[0], found


def test_a_misspelt_check_cannot_be_made():
    from attnbench.accuracy.bounds import Check

    with pytest.raises(ValueError, match="'paritty': expected one of reference"):
        Check("paritty", "out", "rel_l2", 0.0, 1.0, True)


def test_case_fields_follow_the_dataclass_and_refuse_a_stale_exclusion():
    assert case_fields() == CASE_FIELDS
    assert "dropout" in case_fields(without=("dtype",)) and "dtype" not in case_fields(
        without=("dtype",))
    assert set(case_fields(of_type=int)) >= {"cp", "tp", "page_size", "seed"}
    with pytest.raises(ValueError, match="not fields of Case: \\['gpu_kind'\\]"):
        case_fields(without=("gpu_kind",))


def test_the_attention_kind_rule_is_the_cases():
    for hq, hkv, kind in ((8, 8, "MHA"), (8, 2, "GQA"), (8, 1, "MQA"), (1, 1, "MHA")):
        assert attention_kind(hq, hkv) == kind == Case(backend="x", heads_q=hq,
                                                       heads_kv=hkv).attention_kind


def test_the_old_home_of_the_dispatch_names_still_imports_with_a_warning():
    import attnbench.dispatch as dispatch

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert dispatch.DISPATCHES is DISPATCHES
    assert [str(w.message) for w in seen] == [
        "attnbench.dispatch.DISPATCHES moved to attnbench.resources.DISPATCHES; import it from "
        "there"]
    assert "DISPATCHES" not in dispatch.__all__
