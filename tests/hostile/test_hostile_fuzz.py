"""Property-based fuzzing of everything a user or a colleague hands attnbench (issue 13): sweep
files, journal lines and records, manifests. Whatever is generated, every command answers with
exit status 0, 1 or 2 (3 only from the stand-in cluster below), never a traceback, within a few
seconds, and writes nothing outside the run directory and the dashboard directory it was given.

Two profiles of the same properties: the fast one runs in ``make test`` (a few seconds, in
process); ``make test-slow`` (``-m slow``) runs many more examples and a few more subprocesses.
Hypothesis keeps no example database, and its caches go to the git-ignored build/; a failure
prints the example and the seed to reproduce it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis.configuration import set_hypothesis_home_dir  # noqa: E402
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from attnbench import cli  # noqa: E402
from attnbench.errors import ClusterError  # noqa: E402
from attnbench.results.records import TENSORS, VERDICTS, make_record  # noqa: E402
from attnbench.results.store import RunStore  # noqa: E402
from attnbench.sweep.case import CASE_FIELDS, make_case  # noqa: E402
from attnbench.sweep.load import load_sweep  # noqa: E402
from helpers import DATA, ROOT, attnbench_cmd  # noqa: E402

# Hypothesis keeps caches (not examples) in its home: the git-ignored build/, not the checkout.
set_hypothesis_home_dir(ROOT / "build" / "hypothesis")
MINIMAL = str(DATA / "minimal.yaml")
FAST = settings(max_examples=25, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=400, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])
LIMIT_S = 30
"""Seconds one command may take on one generated input before it counts as a hang."""
NO_CLUSTER = "fuzz: no cluster here"

# -- what is generated ---------------------------------------------------------------------------

NASTY = ["<x>", "\"'><x onerror=1>", "\x1b[2J", "\x00", "\r\n", "\u202e", "../../etc", "*", "&a",
         "!!python/object/apply:os.system", "naive", "sdpa", "os:getcwd", "causal", "fp32",
         "window", "nan", "1e999", "", " ", "x" * 300]
TEXT = st.one_of(st.sampled_from(NASTY), st.text(max_size=12))
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                   st.integers(-3, 300), st.floats(allow_nan=True, allow_infinity=True), TEXT)
VALUE = st.recursive(SCALAR, lambda kids: st.lists(kids, max_size=4)
                     | st.dictionaries(TEXT, kids, max_size=4), max_leaves=12)
PUBLIC = [f for f in CASE_FIELDS if not f.startswith("window_")]
GOOD = {"backend": ["naive", "sdpa", "x:Y", "testing.noop"], "batch": [1, 2],
        "seqlen_q": [1, 16, 33], "seqlen_kv": [8, 16], "heads_q": [1, 2, 4], "heads_kv": [1, 2],
        "head_dim": [8, 16], "head_dim_v": [8], "mask": ["none", "causal", {"window": 4},
                                                         {"window": [2, -1]}],
        "bias": ["none", "alibi"], "dropout": [0.0, 0.1], "softcap": [0.0, 30.0],
        "dtype": ["fp32", "bf16", "half"], "cp": [1, 2, 4], "cp_algo": ["ring", "zigzag"],
        "tp": [1, 2], "gpu": ["any", "cpu", "H100"], "inputs": ["normal", "outliers"],
        "seed": [0, 1, 7]}
FIELD = st.one_of(st.sampled_from(PUBLIC), TEXT)


def _mostly(good: st.SearchStrategy, bad: st.SearchStrategy) -> st.SearchStrategy:
    """``good`` four times in five: most generated inputs are valid but for one or two
    values, so the code past validation gets fuzzed too."""
    return st.sampled_from([True] * 4 + [False]).flatmap(lambda ok: good if ok else bad)


def _field_value(name) -> st.SearchStrategy:
    good = GOOD.get(name) if isinstance(name, str) else None
    return _mostly(st.sampled_from(good), VALUE) if good else VALUE


PARTIAL = _mostly(st.sampled_from(PUBLIC).flatmap(lambda f: _field_value(f).map(lambda v: {f: v})),
                  st.dictionaries(FIELD, VALUE, max_size=3))
AXES = st.lists(st.sampled_from(PUBLIC), max_size=4, unique=True).flatmap(
    lambda names: st.fixed_dictionaries({n: _mostly(st.lists(_field_value(n), min_size=1,
                                                             max_size=3), VALUE)
                                         for n in names}))
OPTIONS = st.dictionaries(_mostly(st.sampled_from(["timeout_s", "accuracy", "timing"]), TEXT),
                          st.one_of(VALUE, st.dictionaries(
                              _mostly(st.sampled_from(["warmup", "warmup_ms", "min_samples",
                                                       "max_samples", "max_seconds",
                                                       "target_rel_iqr", "mode", "enabled"]),
                                      TEXT), SCALAR, max_size=3)), max_size=2)
SWEEP_DICT = st.fixed_dictionaries(
    {"name": _mostly(st.just("t"), VALUE),
     "defaults": _mostly(st.just({"backend": "naive", "seqlen_q": 16, "heads_q": 2,
                                  "head_dim": 8}), st.dictionaries(FIELD, VALUE, max_size=4))},
    optional={"axes": AXES, "exclude": st.lists(PARTIAL, max_size=2),
              "include": st.lists(PARTIAL, max_size=2), "options": OPTIONS,
              "description": _mostly(TEXT, VALUE)})
YAML_BITS = ["&a [1, 2]", "*a", "*nope", "<<: *a", "!!python/object/apply:os.system ['true']",
             "{", "]", "'", "\t", "? [a]\n: 1", "name: again", "---\n", "%YAML 1.1\n", "\x00",
             "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", ".nan", ".inf", "- "]


@st.composite
def sweep_texts(draw) -> str:
    text = yaml.safe_dump(draw(SWEEP_DICT), allow_unicode=draw(st.booleans()))
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):  # splice YAML syntax in somewhere
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.sampled_from(YAML_BITS) | st.text(max_size=6)) + text[at:]
    return text


SWEEP = """name: fuzz
defaults: {backend: naive, batch: 1, seqlen_q: 16, heads_q: 2, head_dim: 8, dtype: fp32}
axes: {seed: [0, 1]}
options: {timeout_s: 30, timing: {enabled: false}}
"""


def _template_record(case, verdict: str) -> dict:
    stats = {"median_ms": 1.0, "q1_ms": 0.9, "q3_ms": 1.1, "min_ms": 0.8, "n": 5,
             "samples_ms": [1.0, 0.9], "noisy": False, "tflops": 1.0, "gbps": 2.0,
             "peak_memory_bytes": 1024}
    return make_record(
        case, verdict=verdict, reason="why",
        checks=[{"check": "reference", "tensor": "dq", "metric": "rel_l2", "value": 0.004,
                 "bound": 0.01, "passed": True}],
        accuracy={"reference": "exact", "tensors": {t: {"rel_l2": 1e-3, "bound": 1e-2,
                                                        "nonfinite": 0} for t in TENSORS},
                  "identities": {"dv_v": {"value": 1e-6, "bound": 1e-3}}},
        timing={"clock": "perf_counter", "mode": "eager", "flops_fwd": 1e9, "fwd": stats,
                "bwd": dict(stats)},
        crash={"signal": "SIGSEGV", "exit_code": -11, "rank": 0, "stderr_tail": "t",
               "traceback": "tb"},
        env={"host": "h", "device": "cpu", "device_name": "cpu", "gpu_kind": "cpu",
             "identity": {"name": "cpu", "sm_count": 1},
             "software": {"torch": "2", "dirty": False}})


def _paths(value, prefix=()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, v in value.items():
            out += _paths(v, prefix + (key,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, prefix + (i,))
    return out


DELETE = object()


def _mutate(value, edits):
    for path, new in edits:
        target = value
        try:
            for key in path[:-1]:
                target = target[key]
            if new is DELETE and isinstance(target, dict):
                target.pop(path[-1], None)
            elif new is not DELETE:
                target[path[-1]] = new
        except (KeyError, IndexError, TypeError):
            pass
    return value


TEMPLATE_PATHS = _paths(_template_record(make_case("t", {"backend": "naive"}), "pass"))
EDITS = st.lists(st.tuples(st.sampled_from(TEMPLATE_PATHS), VALUE | st.just(DELETE)), min_size=1,
                 max_size=2)


@st.composite
def journals(draw, cases) -> bytes:
    lines = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["record"] * 6 + ["edited"] * 3 + ["raw"]))
        if kind == "raw":
            lines.append(draw(st.binary(max_size=40) | st.sampled_from(
                [b"42", b"[]", b"{}", b"NaN", b'{"id":', b"\xff\xfe", b"[" * 5000])))
            continue
        record = _template_record(draw(st.sampled_from(cases)), draw(st.sampled_from(VERDICTS)))
        if kind == "edited":
            record = _mutate(record, draw(EDITS))
        try:
            lines.append(json.dumps(record).encode())
        except (TypeError, ValueError):
            lines.append(b"{}")
    return b"\n".join(lines) + draw(st.sampled_from([b"\n", b""]))


@st.composite
def manifests(draw, template: dict) -> bytes:
    kind = draw(st.sampled_from(["same"] * 3 + ["edited"] * 2 + ["raw"]))
    if kind == "raw":
        return draw(st.binary(max_size=40) | st.sampled_from([b"[]", b"{}", b"null", b"{"]))
    manifest = json.loads(json.dumps(template))
    if kind == "edited":
        edits = draw(st.lists(st.tuples(st.sampled_from(_paths(template)), VALUE | st.just(DELETE)),
                              max_size=3))
        manifest = _mutate(manifest, edits)
    return json.dumps(manifest).encode()


# -- running commands on them ---------------------------------------------------------------------

@contextlib.contextmanager
def _time_limit(seconds: float):
    def expired(signum, frame):
        raise TimeoutError(f"took more than {seconds} s: a hang")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _cli(args: list[str]) -> tuple[int, str]:
    """``attnbench ARGS`` in this process: (exit status, stderr). Any exception is a bug."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _time_limit(LIMIT_S):
        try:
            rc = cli.main(args)
        except SystemExit as exc:  # argparse
            rc = exc.code
    return rc, err.getvalue()


def _snapshot(root: Path) -> dict[str, tuple]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in root.rglob("*") if p.is_file()}


def _only_inside(before: dict, after: dict, *allowed: str) -> None:
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    outside = [k for k in changed if not any(k == a or k.startswith(a + os.sep) for a in allowed)]
    assert not outside, f"files written outside {allowed}: {outside}"


def _check(rc, err, allowed=(0, 1, 2)):
    assert rc in allowed, (rc, err)
    assert "Traceback" not in err, err
    if rc == 2 and not err.startswith("usage:"):
        # one line per mistake (a sweep's come all at once), each naming the command
        lines = err.splitlines()
        assert lines and len(lines) <= 31 and err.endswith("\n"), err
        assert all(line.startswith("attnbench") for line in lines), err


@pytest.fixture(autouse=True)
def _no_cluster(monkeypatch):
    """A generated run never reaches Dask: connecting is where the fuzzed path ends."""
    import attnbench.cluster.connect

    def refuse(*args, **kwargs):
        raise ClusterError(NO_CLUSTER)

    monkeypatch.setattr(attnbench.cluster.connect, "connect", refuse)


@contextlib.contextmanager
def _workdir():
    """A fresh directory, made the working directory (a default output lands in it)."""
    with tempfile.TemporaryDirectory(prefix="attnbench-fuzz-") as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            yield Path(tmp)
        finally:
            os.chdir(cwd)


def check_sweep(text: str) -> None:
    with _workdir() as tmp:
        (tmp / "s.yaml").write_text(text, encoding="utf-8", errors="surrogatepass")
        before = _snapshot(tmp)
        rc, err = _cli(["validate", "s.yaml", "--list"])
        _check(rc, err, (0, 2))
        event(f"validate: exit {rc}")
        if rc == 0:  # a valid sweep: the run path up to the cluster, and its run directory
            rc, err = _cli(["run", "s.yaml", "--out", "run", "--no-report"])
            _check(rc, err, (2, 3))
            assert rc == 2 or NO_CLUSTER in err, err
            assert not (tmp / "run").exists(), "a run that never started left its directory"
        _only_inside(before, _snapshot(tmp))


def check_run_directory(journal: bytes, manifest: bytes, report: bool,
                        dashboard: str = MINIMAL) -> None:
    with _workdir() as tmp:
        (tmp / "fuzz.yaml").write_text(SWEEP)
        good = tmp / "good"
        store = RunStore(good, load_sweep(tmp / "fuzz.yaml"), command=["fuzz"])
        for case in store.sweep.cases:
            store.append(_template_record(case, "pass"))
        store.close()
        run = tmp / "run"
        run.mkdir()
        (run / "records.jsonl").write_bytes(journal)
        (run / "manifest.json").write_bytes(manifest)
        before = _snapshot(tmp)
        for args in (["show", "run", "--all"], ["compare", "good", "run", "--no-dashboard"],
                     ["history", "good", "run"],
                     ["run", "fuzz.yaml", "--out", "run", "--no-report"]):
            rc, err = _cli(args)
            _check(rc, err, (0, 1, 2, 3))
            assert rc != 3 or NO_CLUSTER in err, err
            event(f"{args[0]}: exit {rc}")
        if report:
            rc, err = _cli(["report", "run", "--dashboard", dashboard, "--out", "dash"])
            _check(rc, err)
            event(f"report: exit {rc}")
            if rc == 0:
                html = (tmp / "dash" / "index.html").read_text()
                assert "<x" not in html and "onerror=1" not in html.replace("onerror=1&", "")
        _only_inside(before, _snapshot(tmp), "run", "dash")


def _cases():
    return list(load_sweep_text(SWEEP).cases) + [make_case("x", {"backend": "sdpa", "seed": 5})]


def load_sweep_text(text: str):
    from attnbench.sweep.load import parse_sweep

    return parse_sweep(text, "fuzz.yaml")


CASES = _cases()
with tempfile.TemporaryDirectory() as _tmp:  # the manifest `attnbench run` writes for SWEEP
    (Path(_tmp) / "fuzz.yaml").write_text(SWEEP)
    _store = RunStore(Path(_tmp) / "run", load_sweep(Path(_tmp) / "fuzz.yaml"), command=["fuzz"])
    _store.close()
    MANIFEST = json.loads((Path(_tmp) / "run" / "manifest.json").read_text())


# -- the properties, fast (make test) and long (make test-slow) ----------------------------------

@FAST
@given(sweep_texts())
def test_fuzzed_sweep_files(text):
    check_sweep(text)


@FAST
@given(journals(CASES), manifests(MANIFEST), st.booleans())
def test_fuzzed_run_directories(journal, manifest, report):
    check_run_directory(journal, manifest, report and manifest.startswith(b"{"))


@pytest.mark.slow
@SLOW
@given(sweep_texts())
def test_fuzzed_sweep_files_long(text):
    check_sweep(text)


@pytest.mark.slow
@SLOW
@given(journals(CASES), manifests(MANIFEST), st.booleans())
def test_fuzzed_run_directories_long(journal, manifest, report):
    check_run_directory(journal, manifest, report)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(journals(CASES), manifests(MANIFEST))
def test_fuzzed_run_directories_drawn_with_every_panel_long(journal, manifest):
    """Every panel of the default dashboard (log axes, facets, heatmaps) on fuzzed records."""
    check_run_directory(journal, manifest, True, str(ROOT / "dashboards" / "default.yaml"))


def _subprocess_check(text: str, tmp: Path) -> None:
    path = tmp / "s.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run([*attnbench_cmd(), "validate", str(path)], capture_output=True,
                          text=True, timeout=60, cwd=tmp, env=env)
    assert proc.returncode in (0, 2) and "Traceback" not in proc.stderr, proc.stderr


@settings(max_examples=2, deadline=None, database=None, derandomize=True)
@given(sweep_texts())
def test_fuzzed_sweep_files_through_the_real_command(text):
    """The same property through `python -m attnbench.cli` (a handful: each costs a start)."""
    with tempfile.TemporaryDirectory() as tmp:
        _subprocess_check(text, Path(tmp))


@pytest.mark.slow
@settings(max_examples=30, deadline=None, database=None)
@given(sweep_texts())
def test_fuzzed_sweep_files_through_the_real_command_long(text):
    with tempfile.TemporaryDirectory() as tmp:
        _subprocess_check(text, Path(tmp))
