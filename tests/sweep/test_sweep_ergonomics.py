"""Sweep ergonomics (issue 17, item 3): zipped axes, ranges, ``-s`` overrides, every mistake in
one pass with "did you mean", a JSON Schema for editors, and a run that grows with its sweep."""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from attnbench import cli
from attnbench.backends import check_backend_name, public_names
from attnbench.errors import RunDirError, SweepError
from attnbench.results.store import RunStore, latest_run_dir, load_manifest
from attnbench.sweep.case import MAX_CASES, PUBLIC_FIELDS
from attnbench.sweep.load import load_sweep, parse_sweep
from attnbench.sweep.schema import schema_text, sweep_schema
from helpers import ROOT, attnbench_cmd

BASE = "name: t\ndefaults: {backend: naive, heads_q: 8, head_dim: 16}\n"


def _ids(text: str, *overrides: str) -> list[str]:
    return [c.id for c in parse_sweep(text, "t.yaml", check_backend_name, overrides).cases]


def _mistakes(text: str, *overrides: str) -> list[str]:
    with pytest.raises(SweepError) as info:
        parse_sweep(text, "bad.yaml", check_backend_name, overrides)
    return str(info.value).split("\n")


# -- zipped axes and ranges ---------------------------------------------------------------------

# sweeps/kernel_gpu.yaml before zipped axes: 32 excludes pairing batch with seqlen_q and heads_q
# with head_dim. Its rewrite must be the same sweep: the same case ids, in the same order (so the
# digest, and with it resuming an earlier run, is unchanged).
KERNEL_GPU_WITH_EXCLUDES = """
name: kernel_gpu
defaults: {dtype: bf16, seed: 0}
axes:
  backend: [triton, sdpa_flash, sdpa_cudnn, sdpa_efficient]
  seqlen_q: [512, 1024, 2048, 4096, 8192, 16384]
  batch: [32, 16, 8, 4, 2, 1]
  head_dim: [64, 128]
  heads_q: [32, 16]
  mask: [none, causal]
exclude: [
  {head_dim: 64, heads_q: 16},
  {head_dim: 128, heads_q: 32},
  {batch: 32, seqlen_q: 1024}, {batch: 32, seqlen_q: 2048}, {batch: 32, seqlen_q: 4096},
  {batch: 32, seqlen_q: 8192}, {batch: 32, seqlen_q: 16384},
  {batch: 16, seqlen_q: 512}, {batch: 16, seqlen_q: 2048}, {batch: 16, seqlen_q: 4096},
  {batch: 16, seqlen_q: 8192}, {batch: 16, seqlen_q: 16384},
  {batch: 8, seqlen_q: 512}, {batch: 8, seqlen_q: 1024}, {batch: 8, seqlen_q: 4096},
  {batch: 8, seqlen_q: 8192}, {batch: 8, seqlen_q: 16384},
  {batch: 4, seqlen_q: 512}, {batch: 4, seqlen_q: 1024}, {batch: 4, seqlen_q: 2048},
  {batch: 4, seqlen_q: 8192}, {batch: 4, seqlen_q: 16384},
  {batch: 2, seqlen_q: 512}, {batch: 2, seqlen_q: 1024}, {batch: 2, seqlen_q: 2048},
  {batch: 2, seqlen_q: 4096}, {batch: 2, seqlen_q: 16384},
  {batch: 1, seqlen_q: 512}, {batch: 1, seqlen_q: 1024}, {batch: 1, seqlen_q: 2048},
  {batch: 1, seqlen_q: 4096}, {batch: 1, seqlen_q: 8192},
]
"""


def test_kernel_gpu_with_zipped_axes_is_the_same_sweep_as_with_32_excludes():
    zipped = load_sweep(ROOT / "sweeps/kernel_gpu.yaml", check_backend_name)
    assert "exclude" not in zipped.source and "zip:" in zipped.source
    before = parse_sweep(KERNEL_GPU_WITH_EXCLUDES, "old.yaml", check_backend_name)
    assert [c.id for c in zipped.cases] == [c.id for c in before.cases]
    assert zipped.digest == before.digest and len(zipped.cases) == 96
    assert {c.batch * c.seqlen_q for c in zipped.cases} == {16384}
    assert {c.heads_q * c.head_dim for c in zipped.cases} == {2048}


def test_a_zipped_group_varies_its_fields_together_and_crosses_the_others():
    sweep = parse_sweep(BASE + "axes:\n  mask: [none, causal]\n  tokens:\n"
                        "    zip: {batch: [4, 2, 1], seqlen_q: [32, 64, 128]}\n", "t.yaml")
    assert [(c.mask, c.batch, c.seqlen_q) for c in sweep.cases] == [
        ("none", 4, 32), ("none", 2, 64), ("none", 1, 128),
        ("causal", 4, 32), ("causal", 2, 64), ("causal", 1, 128)]


@pytest.mark.parametrize("axis, values", [
    ("{pow2: [512, 131072]}", [512 << i for i in range(9)]),
    ("{pow2: [32, 1]}", [32, 16, 8, 4, 2, 1]),
    ("{range: [1, 4]}", [1, 2, 3, 4]),
    ("{range: [0, 10, 5]}", [0, 5, 10]),
    ("{range: [0, 9, 5]}", [0, 5]),
    ("{range: [3, 1]}", [3, 2, 1]),
])
def test_ranges_expand_with_both_ends_included(axis, values):
    sweep = parse_sweep(BASE + f"axes: {{seed: {axis}}}\n", "t.yaml")
    assert [c.seed for c in sweep.cases] == values


@pytest.mark.parametrize("axes, expected", [
    ("{seqlen_q: {pow2: [500, 4096]}}", "axes.seqlen_q.pow2: got [500, 4096], expected [first, "
                                        "last], both powers of two"),
    ("{seqlen_q: {range: [1, 5, 0]}}", "axes.seqlen_q.range: got [1, 5, 0], expected [start, "
                                       "stop] or [start, stop, step]"),
    ("{seqlen_q: {range: [1, 5, -1]}}", "expected a step that goes from 1 towards 5"),
    ("{dropout: {range: [0, 1]}}", "axes.dropout.range: got {'range': [0, 1]}, expected a list "
                                   "of values (ranges are for integer fields)"),
    ("{seqlen_q: {range: [1, 2000000000]}}", f"expected at most {MAX_CASES:,} values (this "
                                             "range has 2,000,000,000)"),
    ("{seqlen_q: {pow2: [1, 1073741824]}, seed: {range: [0, 99999]}}",
     f"seqlen_q (31) x seed (100000) = 3,100,000 cases, more than the {MAX_CASES:,}"),
    ("{seqlen_q: {pow2: [1024, 4294967296]}}", "axes.seqlen_q[22]: got 4294967296"),
    ("{g: {zip: {batch: [1, 2], seqlen_q: [8]}}}", "axes.g.zip: got batch with 2 values, "
                                                   "seqlen_q with 1 values; expected as many"),
    ("{g: {zip: {batch: [1], seqln_q: [8]}}}", "axes.g.zip.seqln_q: unknown field 'seqln_q' "
                                               "(did you mean seqlen_q?)"),
    ("{g: {zip: {batch: [1]}}}", "axes.g: got {'zip': {'batch': [...]}}, expected a zipped "
                                 "group {zip: {field: [values], field: [values], ...}} of two"),
    ("{batch: [1], g: {zip: {batch: [1, 2], seed: [1, 2]}}}",
     "axes.g: batch is already an axis (axes.batch); a field may vary in one axis only"),
])
def test_range_and_zip_mistakes_are_named_and_counted_before_expansion(axes, expected):
    t0 = time.perf_counter()
    lines = _mistakes(BASE + f"axes: {axes}\n")
    assert time.perf_counter() - t0 < 5  # a 2e9-value range is refused by counting
    assert any(expected in line for line in lines), lines


# -- every mistake in one pass, with "did you mean" ---------------------------------------------

def test_every_mistake_is_reported_in_one_pass():
    text = ("name: t\ndefaults: {bakend: naive}\naxes:\n  seqlen: [128]\n  dtype: [bf61]\n"
            "  dropout: [2]\n  g:\n    zip: {batch: [1, 2], seqlen_q: [8]}\n"
            "exclude: [{mask: diagonal}]\noptions: {timeot_s: 3, timing: {warmpu: 1}}\nextra: 1\n")
    lines = _mistakes(text)
    expected = [
        "bad.yaml: extra: unknown key 'extra', expected one of name, description",
        "bad.yaml: defaults.bakend: unknown field 'bakend' (did you mean backend?)",
        "bad.yaml: axes.seqlen: unknown field 'seqlen' (did you mean seqlen_q?)",
        "bad.yaml: axes.dtype[0]: got 'bf61', expected one of fp32, fp16, bf16, fp8_e4m3, "
        "fp8_e5m2 (did you mean bf16?)",
        "bad.yaml: axes.dropout[0]: got 2, expected a number in [0, 1)",
        "bad.yaml: axes.g.zip: got batch with 2 values, seqlen_q with 1 values",
        "bad.yaml: exclude[0].mask: got 'diagonal', expected one of none, causal",
        "bad.yaml: options.timeot_s: unknown option 'timeot_s' (did you mean timeout_s?)",
        "bad.yaml: options.timing.warmpu: unknown option 'warmpu' (did you mean warmup?)",
    ]
    assert len(lines) == len(expected), lines
    for want, line in zip(expected, lines):
        assert line.startswith(want), (want, line)


def test_a_flood_of_mistakes_is_cut_to_a_readable_count():
    values = ", ".join(str(-n) for n in range(1, 201))  # 200 different mistakes
    lines = _mistakes(BASE + f"axes: {{seqlen_q: [{values}]}}\n")
    assert len(lines) == 31 and lines[-1] == "bad.yaml: ... 170 more mistakes like these"


def test_the_same_mistake_at_many_places_is_one_line():
    """Issue 40 item 3: a cause shared by many places is said once, with a count."""
    values = ", ".join(["-1"] * 200)
    (line,) = _mistakes(BASE + f"axes: {{seqlen_q: [{values}]}}\n")
    assert line.startswith("bad.yaml: axes.seqlen_q[0]: got -1")
    assert line.endswith("(the same at 199 more places: axes.seqlen_q[1], axes.seqlen_q[2], "
                         "axes.seqlen_q[3], ...)"), line


def test_a_misspelt_backend_gets_a_suggestion():
    (line,) = _mistakes(BASE + "axes: {backend: [sdpa_flsh]}\n")
    assert line.startswith("bad.yaml: axes.backend[0]: got 'sdpa_flsh', expected one of ")
    assert line.endswith("(did you mean sdpa_flash?)")


def test_no_suggestion_for_a_name_nothing_resembles():
    (line,) = _mistakes(BASE + "axes: {zzzz: [1]}\n")
    assert "did you mean" not in line and "unknown field 'zzzz', expected one of" in line


# -- -s overrides -------------------------------------------------------------------------------

SMALL = BASE + """axes:
  dtype: [fp32, bf16]
  mask: [none, causal]
  tokens:
    zip: {batch: [4, 2, 1], seqlen_q: [32, 64, 128]}
exclude: [{dtype: bf16, mask: causal}]
include: [{seqlen_q: 16, dtype: fp16}]
"""


def _cases(*overrides: str):
    return parse_sweep(SMALL, "t.yaml", check_backend_name, overrides).cases


def test_an_override_makes_a_field_take_its_value_in_every_case():
    cases = _cases("dtype=fp16")
    assert {c.dtype for c in cases} == {"fp16"}
    # the axis, the include's own value and the exclude naming bf16 are all overridden
    assert len(cases) == 2 * 3 + 1
    listed = _cases("dtype=[fp32, bf16]", "head_dim=32")
    assert {(c.dtype, c.head_dim) for c in listed} == {("fp32", 32), ("bf16", 32)}
    assert len(listed) == 3 * 3 + 2  # bf16 x causal still excluded; include once per dtype


def test_an_override_of_a_zipped_field_keeps_its_points():
    cases = _cases("seqlen_q=64")
    # the point (batch 2, seqlen 64) of the group; the include (batch 1) at seqlen 64 too
    assert {(c.batch, c.seqlen_q, c.dtype) for c in cases} == {
        (2, 64, "fp32"), (2, 64, "bf16"), (1, 64, "fp16")}
    both = _cases("seqlen_q=[32, 128]", "mask=causal", "dtype=fp32")
    assert {(c.batch, c.seqlen_q, c.mask) for c in both} == {
        (4, 32, "causal"), (1, 128, "causal"), (1, 32, "causal")}


def test_overrides_of_options_and_ranges():
    sweep = parse_sweep(SMALL, "t.yaml", None, ("options.timeout_s=7",
                                                "options.timing.max_seconds=0.5",
                                                "seed={range: [0, 2]}"))
    assert sweep.options.timeout_s == 7 and sweep.options.timing.max_seconds == 0.5
    assert {c.seed for c in sweep.cases} == {0, 1, 2}
    assert sweep.overrides[0] == "options.timeout_s=7"


def test_override_mistakes_name_the_override():
    lines = _mistakes(SMALL, "seqlen_q=100", "seqln=3", "dtype=fp8", "noequals",
                      "options.timeout_s=-1", "options.timing.warmpu=1")
    assert lines == [
        "-s seqln: unknown field 'seqln' (did you mean seqlen_q?), expected one of "
        + ", ".join(PUBLIC_FIELDS) + ", name, description, options.KEY, options.timing.KEY",
        "-s 'noequals': expected FIELD=VALUE, e.g. -s seqlen_q=1024 or -s dtype=[fp32,bf16]",
        "-s dtype: got 'fp8', expected one of fp32, fp16, bf16, fp8_e4m3, fp8_e5m2",
        "-s seqlen_q: got [100], expected values zipped in axes.tokens: 32, 64, 128",
        "-s options.timeout_s: got -1, expected a positive number <= 604800 (a week)",
        "-s options.timing.warmpu: unknown option 'warmpu' (did you mean warmup?), expected one "
        "of enabled, warmup, warmup_ms, min_sample_ms, cpu_min_sample_ms, mode, min_samples, "
        "max_samples, target_rel_iqr, max_seconds, cpu_clock",
    ]


def test_validate_takes_overrides_on_the_command_line(capsys):
    sweep = str(ROOT / "sweeps/kernel_gpu.yaml")
    assert cli.main(["validate", sweep, "-s", "seqlen_q=1024", "--set", "backend=triton"]) == 0
    assert "ok: sweep 'kernel_gpu', 4 cases (triton: 4)" in capsys.readouterr().out
    assert cli.main(["validate", sweep, "-s", "seqlen_q=1000", "-s", "batch=3"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["attnbench: error: -s seqlen_q: got [1000], expected values zipped in "
                   "axes.tokens: 512, 1024, 2048, 4096, 8192, 16384",
                   "attnbench: error: -s batch: got [3], expected values zipped in axes.tokens: "
                   "1, 2, 4, 8, 16, 32"]


# -- JSON Schema --------------------------------------------------------------------------------

def _valid(instance, schema, root) -> bool:
    """A JSON Schema (draft-07) checker for the keywords the sweep schema uses."""
    if "$ref" in schema:
        return _valid(instance, root["definitions"][schema["$ref"].split("/")[-1]], root)
    kinds = {"object": dict, "array": list, "string": str, "boolean": bool}
    kind = schema.get("type")
    if kind in ("integer", "number"):
        if isinstance(instance, bool) or not isinstance(
                instance, int if kind == "integer" else (int, float)):
            return False
    elif kind and not isinstance(instance, kinds[kind]):
        return False
    if "enum" in schema and instance not in schema["enum"]:
        return False
    if "anyOf" in schema and not any(_valid(instance, s, root) for s in schema["anyOf"]):
        return False
    for key, test in (("minimum", lambda v, b: v >= b), ("maximum", lambda v, b: v <= b),
                      ("exclusiveMinimum", lambda v, b: v > b),
                      ("exclusiveMaximum", lambda v, b: v < b)):
        if key in schema and not test(instance, schema[key]):
            return False
    if isinstance(instance, str):
        if not schema.get("minLength", 0) <= len(instance) <= schema.get("maxLength", 1e9):
            return False
        if "pattern" in schema and not re.search(schema["pattern"], instance):
            return False
    if isinstance(instance, list):
        if not schema.get("minItems", 0) <= len(instance) <= schema.get("maxItems", 1e9):
            return False
        if "items" in schema and not all(_valid(v, schema["items"], root) for v in instance):
            return False
    if isinstance(instance, dict):
        if not schema.get("minProperties", 0) <= len(instance) <= schema.get("maxProperties",
                                                                             1e9):
            return False
        if any(k not in instance for k in schema.get("required", ())):
            return False
        props, extra = schema.get("properties", {}), schema.get("additionalProperties", True)
        for key, value in instance.items():
            if key in props:
                if not _valid(value, props[key], root):
                    return False
            elif extra is False or (isinstance(extra, dict) and not _valid(value, extra, root)):
                return False
    return True


def test_the_shipped_schema_is_the_generated_one():
    # Regenerate after changing a field: attnbench schema --out sweeps/sweep.schema.json
    assert (ROOT / "sweeps/sweep.schema.json").read_text() == schema_text(public_names())
    for path in sorted((ROOT / "sweeps").glob("*.yaml")):
        assert path.read_text().startswith("# yaml-language-server: $schema=sweep.schema.json\n")


def test_the_schema_types_every_field_from_the_field_table():
    schema = sweep_schema(public_names())
    definitions = schema["definitions"]
    # a field whose rule has no schema (a new kind of rule) would be {} and accept anything
    for name in PUBLIC_FIELDS:
        value = definitions[f"value.{name}"]
        assert {"type", "enum", "anyOf"} & set(value), f"{name} has no schema: {value}"
    assert set(schema["properties"]["defaults"]["properties"]) == set(PUBLIC_FIELDS)
    assert set(schema["properties"]["axes"]["properties"]) == set(PUBLIC_FIELDS)
    assert definitions["value.dropout"]["exclusiveMaximum"] == 1
    assert definitions["value.seqlen_q"]["maximum"] == 2**31 - 1
    assert "bf16" in definitions["value.dtype"]["enum"]
    assert "range" in json.dumps(definitions["axis.seqlen_q"])  # integers take ranges
    assert "range" not in json.dumps(definitions["axis.dtype"])
    assert definitions["value.softcap"]["description"].startswith("0 disables")


def test_every_shipped_sweep_satisfies_the_schema_and_mistakes_do_not():
    import yaml

    schema = sweep_schema(public_names())
    for path in sorted((ROOT / "sweeps").glob("*.yaml")):
        assert _valid(yaml.safe_load(path.read_text()), schema, schema), path
    good = yaml.safe_load(SMALL)
    assert _valid(good, schema, schema)
    for bad in ({"axes": {"seqln_q": [1]}}, {"axes": {"dtype": ["bf61"]}},
                {"axes": {"seqlen_q": {"pow3": [1, 2]}}}, {"axes": {"g": {"zap": {}}}},
                {"axes": {"dropout": {"range": [0, 1]}}}, {"defaults": {"mask": "diag"}},
                {"options": {"timeot_s": 1}}, {"options": {"timing": {"warmup": -1}}},
                {"include": [{"bakend": "naive"}]}, {"nmae": "x"}):
        broken = json.loads(json.dumps(good))
        for key, value in bad.items():
            broken[key] = {**broken.get(key, {}), **value} if isinstance(value, dict) else value
        assert not _valid(broken, schema, schema), bad


def test_schema_command_prints_json(tmp_path):
    proc = subprocess.run([*attnbench_cmd(), "schema"], capture_output=True, text=True,
                          cwd=ROOT)
    assert proc.returncode == 0 and json.loads(proc.stdout)["title"] == "attnbench sweep"


# -- a run grows with its sweep -----------------------------------------------------------------

def _record(case) -> dict:
    return {"id": case.id, "case": case.to_dict(), "verdict": "pass", "label": case.label}


def test_a_run_extended_with_new_axis_values_runs_only_the_new_cases(tmp_path):
    first = parse_sweep(BASE + "axes: {seqlen_q: [16, 32]}\n", "s.yaml")
    store = RunStore(tmp_path / "run", first, command=["test"])
    for case in first.cases:
        store.append(_record(case))
    store.close()

    grown = parse_sweep(BASE + "axes: {seqlen_q: [16, 32, 64, 128]}\n", "s.yaml")
    store = RunStore(tmp_path / "run", grown, command=["test"])
    assert [c.seqlen_q for c in store.pending()] == [64, 128]
    assert "the run is extended; 2 cases have no record" in store.resume_note
    store.close()
    manifest = load_manifest(tmp_path / "run")
    assert manifest["sweep"]["digest"] == grown.digest and manifest["sweep"]["cases"] == 4
    assert manifest["extended"][0]["from_cases"] == 2

    # what was recorded must stay in the sweep, and options must not change
    shrunk = parse_sweep(BASE + "axes: {seqlen_q: [16, 64]}\n", "s.yaml")
    with pytest.raises(RunDirError, match=r"1 of its recorded cases are not in s.yaml \(e.g. "
                                          r"naive bf16 b1 s32/32.*a run may only grow"):
        RunStore(tmp_path / "run", shrunk, command=["test"])
    slower = parse_sweep(BASE + "axes: {seqlen_q: [16, 32, 64, 128, 256]}\noptions: "
                                "{timeout_s: 9}\n", "s.yaml")
    with pytest.raises(RunDirError, match="started with other options"):
        RunStore(tmp_path / "run", slower, command=["test"])
    assert load_manifest(tmp_path / "run")["sweep"]["digest"] == grown.digest  # untouched

    # --resume finds the run that a grown sweep extends
    (tmp_path / "results").mkdir()
    (tmp_path / "run").rename(tmp_path / "results" / "t-20260101-000000")
    bigger = parse_sweep(BASE + "axes: {seqlen_q: [16, 32, 64, 128, 256]}\n", "s.yaml")
    assert latest_run_dir(bigger, tmp_path / "results").name == "t-20260101-000000"
    assert latest_run_dir(shrunk, tmp_path / "results") is None


def test_extending_a_finished_run_from_the_command_line(tmp_path, cli_env):
    sweep = tmp_path / "grow.yaml"
    sweep.write_text("name: grow\ndefaults: {backend: naive, heads_q: 2, head_dim: 16, "
                     "dtype: fp32}\naxes: {seqlen_q: [16]}\noptions: {timeout_s: 60, timing: "
                     "{warmup: 0, warmup_ms: 0, min_samples: 1, max_samples: 2, "
                     "max_seconds: 0.01}}\n")
    out = tmp_path / "run"

    def run(*extra):
        proc = subprocess.run([*attnbench_cmd(), "run", str(sweep), "--out", str(out),
                               "--no-report", "--workers", "1", *extra], capture_output=True,
                              text=True, env=cli_env, cwd=tmp_path, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc

    run()
    grown = run("-s", "seqlen_q=[16, 24]")
    assert "2 cases, 1 already in" in grown.stdout and "1 to run" in grown.stdout
    assert "the run is extended; 1 cases have no record" in grown.stderr
    lines = (out / "records.jsonl").read_text().splitlines()
    assert [json.loads(line)["case"]["seqlen_q"] for line in lines] == [16, 24]
    assert load_manifest(out)["sweep"]["overrides"] == ["seqlen_q=[16, 24]"]
