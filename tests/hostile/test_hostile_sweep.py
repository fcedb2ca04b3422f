"""Hostile sweep files (issue 13): every bad value is one line naming the file and the field,
exit status 2, no traceback, nothing imported or executed, in bounded time and memory.

Classes covered here: 1 (non-finite numbers, integers beyond what their consumer takes),
2 (``validate`` executes nothing), 3 (unbounded expansion: alias bombs, huge products, files
that never end), 7 (rank counts bounded at validation), 9 (sweep names), 13 (duplicate keys,
excludes that match nothing). Everything runs in process, in milliseconds.
"""

from __future__ import annotations

import os
import time

import pytest

from attnbench import cli
from attnbench.backends import check_backend_name
from attnbench.errors import SweepError
from attnbench.sweep.load import parse_sweep

MAX_CASES, MAX_RANKS = 1_000_000, 64  # attnbench.sweep's documented limits

BASE = "name: t\ndefaults: {backend: naive, seqlen_q: 32, heads_q: 2, head_dim: 16}\n"


def _refused(text: str, *expected: str, limit_s: float = 2.0) -> str:
    t0 = time.process_time()  # CPU time: a loaded machine must not fail it, a blow-up must
    with pytest.raises(SweepError) as info:
        parse_sweep(text, "bad.yaml", check_backend_name)
    assert time.process_time() - t0 < limit_s
    message = str(info.value)
    # every mistake in one pass, one short line each, and a bounded number of lines
    lines = message.split("\n")
    assert all(line.startswith("bad.yaml: ") and len(line) < 1000 for line in lines), message
    assert len(lines) <= 31
    for part in expected:
        assert part in message, message
    return message


# -- class 1: every float finite, every integer within what its consumer accepts ---------------

@pytest.mark.parametrize("line, expected", [
    ("axes: {softcap: [.inf]}", "axes.softcap[0]: got inf, expected a finite number >= 0"),
    ("axes: {softcap: [.nan]}", "axes.softcap[0]: got nan"),
    ("axes: {dropout: [.nan]}", "axes.dropout[0]: got nan, expected a number in [0, 1)"),
    ("axes: {seed: [100000000000000000000000000]}",
     "axes.seed[0]: got 100000000000000000000000000, expected an integer in "
     "[0, 9223372036854775807]"),
    ("axes: {seed: [-1]}", "axes.seed[0]: got -1"),
    ("axes: {seqlen_q: [1000000000000000000000000000000]}",
     "expected a positive integer <= 2147483647"),
    ("axes: {mask: [{window: 100000000000000000000}]}", "axes.mask[0].window"),
    ("options: {timeout_s: .nan}", "options.timeout_s: got nan, expected a positive number"),
    ("options: {timeout_s: .inf}", "options.timeout_s: got inf"),
    ("options: {timeout_s: 1.0e+300}", "options.timeout_s: got 1e+300"),
    ("options: {timing: {warmup_ms: .nan}}", "options.timing.warmup_ms: got nan"),
    ("options: {timing: {max_seconds: .inf}}", "options.timing.max_seconds: got inf"),
    ("options: {timing: {target_rel_iqr: .nan}}", "options.timing.target_rel_iqr: got nan"),
    ("options: {timing: {min_sample_ms: -.inf}}", "options.timing.min_sample_ms: got -inf"),
    ("options: {timing: {max_samples: 1000000000}}", "options.timing.max_samples: got 1000000000"),
    ("options: {timing: {min_samples: 50, max_samples: 10}}", "options.timing.min_samples: got 50, "
                                                             "expected at most max_samples=10"),
    ("options: {accuracy: 1}", "options.accuracy: got 1, expected true or false"),
])
def test_non_finite_and_out_of_range_values_are_refused(line, expected):
    _refused(BASE + line + "\n", expected)


# -- class 7: ranks bounded at validation --------------------------------------------------------

@pytest.mark.parametrize("line, expected", [
    ("axes: {cp: [1000000000000000000000000000000]}",
     f"axes.cp[0]: got 1000000000000000000000000000000, expected a positive integer <= "
     f"{MAX_RANKS}"),
    ("axes: {tp: [65]}", "axes.tp[0]: got 65"),
    ("axes: {cp: [16], tp: [8]}", f"cp=16 x tp=8 is 128 ranks, expected at most {MAX_RANKS}"),
])
def test_rank_counts_are_bounded(line, expected):
    _refused(BASE.replace("heads_q: 2", "heads_q: 8") + line + "\n", expected)


# -- class 2: validate imports and runs nothing ---------------------------------------------------

def test_validate_imports_no_backend_module(tmp_path, monkeypatch, capsys):
    # The objects exist (validate reads each module's source for it, issue 40 item 3).
    (tmp_path / "sleeps_at_import.py").write_text("import time\ntime.sleep(60)\nB = 1\n")
    (tmp_path / "marks_import.py").write_text(
        f"open({str(tmp_path / 'imported')!r}, 'w').write('x')\nclass B: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sweep = tmp_path / "s.yaml"
    sweep.write_text("name: s\naxes: {backend: ['this:s', 'sleeps_at_import:B', "
                     "'marks_import:B', 'os:getcwd']}\n")
    t0 = time.perf_counter()
    assert cli.main(["validate", str(sweep)]) == 0
    assert time.perf_counter() - t0 < 5
    out = capsys.readouterr().out
    assert "ok: sweep 's', 4 cases" in out and "Zen of Python" not in out
    assert not (tmp_path / "imported").exists()


def test_worker_instantiates_only_backend_classes(tmp_path, monkeypatch):
    """A sweep may name `os:getcwd` or `subprocess:Popen`; the rank process imports the module
    (that is what naming code means) but calls nothing that is not a backend."""
    from attnbench import backends

    (tmp_path / "callme.py").write_text(
        f"def make():\n    open({str(tmp_path / 'called')!r}, 'w').write('x')\n"
        "class NotABackend:\n    def __init__(self):\n"
        f"        open({str(tmp_path / 'constructed')!r}, 'w').write('x')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for ref in ("os:getcwd", "subprocess:Popen", "callme:make", "callme:NotABackend"):
        with pytest.raises(TypeError, match="not a backend|lacks forward"):
            backends.get_backend(ref)
    assert not (tmp_path / "called").exists() and not (tmp_path / "constructed").exists()
    # a backend class is still instantiated (tests/support/buggy_backends.py), built-ins too
    assert backends.get_backend("buggy_backends:ScaledDq").name == "scaled_dq"
    assert backends.get_backend("naive").name


# -- class 3: bounded expansion, size and messages ---------------------------------------------

def _bomb(levels: int = 9) -> str:
    """A YAML flow value whose last item is a 9^levels-leaf "billion laughs" list: 9 aliases of
    the level below at each level (387 million leaves for 9 levels, a few hundred bytes)."""
    parts = ["&l0 [x, x, x, x, x, x, x, x, x]"]
    parts += [f"&l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "[" + ", ".join(parts) + "]"


@pytest.mark.parametrize("text, expected", [
    (f"description: {_bomb()}", "description: got [['x', 'x',"),
    (f"axes: {{seqlen_q: {_bomb()}}}", "axes.seqlen_q[0]: got ['x', 'x',"),
    (f"axes: {{backend: {_bomb()}}}", "axes.backend[0]: got ['x', 'x',"),
    (f"options: {{timing: {_bomb()}}}", "options.timing: got [['x', 'x',"),
    (f"exclude: {_bomb()}", "exclude[0]: got ['x', 'x',"),
    (f"include: [{{seed: {_bomb()}}}]", "include[0].seed: got [['x', 'x',"),
], ids=["description", "field-value", "backend", "options", "exclude", "include"])
def test_yaml_alias_bombs_are_refused_in_bounded_time(text, expected):
    _refused(BASE + text + "\n", expected, limit_s=1.0)
    _refused(f"name: {_bomb()}\n", "name: got [['x', 'x',", limit_s=1.0)


def test_yaml_merge_keys_are_refused():
    # merge keys nest into exponential mappings as aliases cannot; sweeps do not need them
    text = BASE + "axes: {seqlen_q: [8]}\n" \
                  "include: [&x {seqlen_q: 16, seed: 1}, {<<: *x, seed: 2}]\n"
    _refused(text, "merge keys (<<) are not supported")


def test_a_huge_cross_product_is_counted_before_it_is_expanded():
    values = ", ".join(str(i) for i in range(1, 101))
    text = BASE + f"axes: {{seqlen_q: [{values}], head_dim: [{values}], seed: [{values}], " \
                  f"batch: [{values}]}}\n"
    _refused(text, "axes: seqlen_q (100) x head_dim (100) x seed (100) x batch (100) = "
                   f"100,000,000 cases, more than the {MAX_CASES:,} one sweep may have",
             limit_s=1.0)


def test_deep_nesting_and_long_values_give_one_short_line():
    _refused(BASE + "axes: {seqlen_q: " + "[" * 50_000 + "]" * 50_000 + "}\n", "nested too deeply")
    message = _refused(BASE + "axes: {backend: ['" + "x" * 1_000_000 + "']}\n",
                       "axes.backend[0]: got 'xxxx")
    assert len(message) < 600


@pytest.mark.parametrize("make", ["/dev/zero", "directory", "fifo", "huge", "binary"])
def test_sweep_files_that_are_not_small_text_are_refused_unread(tmp_path, make, capsys):
    path = {"/dev/zero": "/dev/zero", "directory": str(tmp_path)}.get(make, str(tmp_path / "s"))
    if make == "fifo":
        os.mkfifo(path)  # opening it would block until a writer comes
    elif make == "huge":
        with open(path, "w") as fh:
            fh.write("name: t\n" + "#" * (2 << 20) + "\n")
    elif make == "binary":
        with open(path, "wb") as fh:
            fh.write(b"name: \xff\xfe\n")
    t0 = time.perf_counter()
    assert cli.main(["validate", path]) == 2
    assert time.perf_counter() - t0 < 5  # a blocking read never returns
    err = capsys.readouterr().err
    assert err.startswith(f"attnbench: error: {path}: ") and err.count("\n") == 1, err


# -- classes 9 and 13: names, duplicate keys, excludes that match nothing ----------------------

@pytest.mark.parametrize("name", ['"t\\0x"', '"t\\nx"', "x" * 300, '"../up"', '"a b"', '"-rf"',
                                  '"t*"'])
def test_sweep_names_that_cannot_name_a_directory_are_refused(name):
    message = _refused(BASE.replace("name: t", f"name: {name}") + "axes: {seed: [0]}\n",
                       "name: got ", "(it names the run directory)")
    assert "\x00" not in message


def test_a_key_given_twice_is_refused_naming_its_line():
    _refused(BASE + "axes: {seed: [0]}\noptions: {timeout_s: 5}\naxes: {seed: [1]}\n",
             "malformed YAML at line 5, column 1: key 'axes' given twice")
    _refused(BASE + "axes: {seed: [0], seed: [1]}\n", "key 'seed' given twice")


def test_an_exclude_that_matches_nothing_is_refused():
    _refused(BASE + "axes: {seed: [0, 1], mask: [none, causal]}\nexclude:\n"
                    "  - {seed: 1, mask: causal}\n  - {seed: 7}\n",
             "exclude[1]: got {'seed': 7}, expected an entry that matches some case")
    ok = parse_sweep(BASE + "axes: {seed: [0, 1]}\nexclude: [{seed: 1}]\n", "ok.yaml")
    assert [c.seed for c in ok.cases] == [0]


def test_validate_prints_one_line_per_mistake_and_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(BASE + "axes: {softcap: [.nan], dropout: [\"\\e[31m\"]}\n")
    assert cli.main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err == f"attnbench: error: {bad}: axes.softcap[0]: got nan, expected a finite number " \
                  ">= 0 (0 disables softcap)\n" \
                  f"attnbench: error: {bad}: axes.dropout[0]: got '\\x1b[31m', expected a " \
                  "number in [0, 1)\n"


# -- issue 41 item 7: the work bounded, not only the bytes ------------------------------------
def _list(count: int, item: str = "0") -> str:
    return "[" + ",".join([item] * count) + "]"


@pytest.mark.parametrize("text, expected", [
    # 400,000 lengths: refused as a pack of more than 4,096 only after 17.4 s of building
    ("axes: {seqlens_q: [" + _list(400_000, "1") + "]}", "line 3, column 20: a list of more "
     "than 10,000 items"),
    # 500,000 zeros: built into 500,000 cases (104 s), then accepted as one
    ("axes: {seed: " + _list(500_000) + "}", "line 3, column 14: a list of more than 10,000"),
    # 250,000 aliases of one value (36 s)
    ("x: &a 0\naxes: {seed: [0]}\ny: [" + ", ".join(["*a"] * 250_000) + "]",
     "more than 1,000 aliases (*name) in one file"),
    # 21 lists of 9,999: no list too long, 209,999 values in all
    ("axes: {seed: [0]}\nz: [" + ", ".join([_list(9_999)] * 21) + "]",
     "more than 200,000 values in one file"),
], ids=["lengths", "zeros", "aliases", "values"])
def test_a_sweep_of_too_many_values_is_refused_before_it_is_built(text, expected):
    """Each under the 1 MiB cap; each refused while the parser's events are counted, in well
    under the 0.5 s of CPU allowed here (~0.02 s measured; building them took 2-100 s)."""
    assert len(BASE + text) < 1 << 20
    _refused(BASE + text + "\n", expected, limit_s=0.5)


def test_the_yaml_bounds_are_where_they_say():
    """Margins: a list of exactly 10,000 items and 200,000 values in all are read; one more item
    or value is refused (the counting must not be off by one, nor count the document itself
    as a value of a list)."""
    from attnbench.validation import MAX_YAML_ITEMS, MAX_YAML_NODES, yaml_too_big

    assert MAX_YAML_ITEMS == 10_000 and MAX_YAML_NODES == 200_000
    assert yaml_too_big(_list(10_000)) is None
    assert "more than 10,000 items" in yaml_too_big(_list(10_001))
    # an outer list (1) of 20 lists (20) of 9,999 (199,980): 200,001 values; 9,998 each: 199,981
    assert "more than 200,000 values" in yaml_too_big("[" + ", ".join([_list(9_999)] * 20) + "]")
    assert yaml_too_big("[" + ", ".join([_list(9_998)] * 20) + "]") is None
    assert yaml_too_big("[" + ", ".join(["*a"] * 1_000) + "]") is None  # malformed: said later
    assert "more than 1,000 aliases" in yaml_too_big("- &a 0\n" + "- *a\n" * 1_001)
    assert yaml_too_big("- &a 0\n" + "- *a\n" * 999) is None
