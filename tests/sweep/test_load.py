"""Sweep files: expansion, stable ids, and every mistake reported as FILE: FIELD: ..."""

import subprocess

import pytest

from attnbench.backends import check_backend_name
from attnbench.errors import SweepError
from attnbench.sweep.case import Case
from attnbench.sweep.load import load_sweep, parse_sweep
from helpers import ROOT, attnbench_cmd

GOOD = """
name: t
defaults: {batch: 1, heads_q: 8, head_dim: 64, dtype: bf16, seed: 0}
axes:
  backend: [naive, sdpa]
  seqlen_q: [128, 256]
  heads_kv: [8, 2, 1]
  mask: [none, causal, {window: 64}, {window: [16, 4]}]
  bias: [none, alibi]
  dropout: [0.0, 0.1]
exclude:
  - {bias: alibi, dropout: 0.1}
include:
  - {backend: naive, seqlen_q: 100, seqlen_kv: 300, mask: causal}
"""


def test_expansion_crosses_axes_and_applies_exclude_and_include():
    sweep = parse_sweep(GOOD, "t.yaml")
    # 2 * 2 * 3 * 4 * (2 * 2 - 1) = 144 from the product, + 1 include
    assert len(sweep.cases) == 145
    assert not any(c.bias == "alibi" and c.dropout == 0.1 for c in sweep.cases)
    windows = {(c.window_left, c.window_right) for c in sweep.cases if c.mask == "window"}
    assert windows == {(63, 0), (16, 4)}
    extra = [c for c in sweep.cases if c.seqlen_q == 100]
    assert extra and extra[0].seqlen_kv == 300 and extra[0].heads_kv == 8  # defaults applied
    plain = [c for c in sweep.cases if c.seqlen_q == 128][0]
    assert plain.seqlen_kv == 128 and plain.head_dim_v == 64


def test_case_ids_are_stable_and_content_addressed():
    a = parse_sweep(GOOD, "t.yaml").cases
    b = parse_sweep(GOOD, "other.yaml").cases
    assert [c.id for c in a] == [c.id for c in b]
    assert len({c.id for c in a}) == len(a)
    case = a[0]
    assert Case.from_dict(case.to_dict()) == case
    assert case.replace(seed=1).id != case.id
    # A pinned id: changing how ids are computed would orphan every stored run.
    fixed = Case(backend="naive", seqlen_q=128, seqlen_kv=128, heads_q=8, heads_kv=8,
                 head_dim=64, head_dim_v=64)
    assert fixed.id == Case.from_dict(fixed.to_dict()).id and len(fixed.id) == 16


# Sweep.digest hashes every case's id: the ids of every committed sweep as the code computed them
# before the id was cached on the case (git show 2874546:attnbench/sweep/case.py; cp_tp as of
# 93e0c99, whose fp32 sink case runs backward again; standard as of 2026-12-02, with a bf16 sink
# beside sdpa's flash-style backward).
PINNED_DIGESTS = {
    "cp_tp": "f9a23e3b29a6", "decode": "f51f06f9a371", "decode_gpu": "1a9332ee6045",
    "flex": "7cff06e0cc3a", "flex_gpu": "4ac2378a42c3", "fp8": "b673fb24e706",
    "fp8_gpu": "67b25ebd2303", "gpu_check_accuracy": "4191cf97925f",
    "gpu_check_cpu_accuracy": "942c5190b391", "gpu_check_cpu_speed": "006bdfe86c08",
    "gpu_check_speed": "49746b2ce778", "kernel_cpu": "41f218ff6df4",
    "kernel_gpu": "bbe78090102e", "smoke": "56de263d2f2f", "standard": "4d0cc47902a6",
    "varlen": "551928ab5b12", "varlen_gpu": "6bc3147c25b6",
    "captured_example": "c964f377e662",  # its ids hold the committed capture's sha256
}


@pytest.mark.parametrize("name", sorted(PINNED_DIGESTS))
def test_committed_sweeps_keep_their_case_ids(name):
    """Stored runs find their records by id: caching the id on the case changed none."""
    sweep = load_sweep(ROOT / "sweeps" / f"{name}.yaml")
    assert sweep.digest == PINNED_DIGESTS[name]
    copy = Case.from_dict(sweep.cases[-1].to_dict())  # computed afresh, not read from a cache
    assert copy.id == sweep.cases[-1].id and "_id" not in sweep.cases[-1].to_dict()


def test_the_cached_id_stays_out_of_equality_hash_and_copies():
    import pickle

    case = Case(backend="naive")
    fresh = Case(backend="naive")
    assert case.id and (case == fresh and hash(case) == hash(fresh))  # one has its id cached
    assert pickle.loads(pickle.dumps(case)).id == case.id
    assert case.replace(seed=1).id != case.id  # a changed case never inherits the cached id


@pytest.mark.parametrize("text, expected", [
    ("name: t\naxes: {backend: [naive], seqlen: [1]}\n", "axes.seqlen: unknown field 'seqlen'"),
    ("name: t\naxes: {backend: [naive], seqlen_q: [128, 'x']}\n", "axes.seqlen_q[1]: got 'x', expected an integer"),
    ("name: t\naxes: {backend: [naive], seqlen_q: [0]}\n", "axes.seqlen_q[0]: got 0, expected a positive integer"),
    ("name: t\naxes: {backend: [naive], batch: [-2]}\n", "axes.batch[0]: got -2, expected a positive integer"),
    ("name: t\ndefaults: {heads_q: 8}\naxes: {backend: [naive], heads_kv: [3]}\n",
     "heads_kv: got 3, expected a divisor of heads_q=8"),
    ("name: t\naxes: {backend: [naive], dropout: [1.0]}\n", "axes.dropout[0]: got 1.0, expected a number in [0, 1)"),
    ("name: t\naxes: {backend: [naive], dropout: [-0.1]}\n", "expected a number in [0, 1)"),
    ("name: t\naxes: {backend: [naive, flashy]}\n", "axes.backend[1]: got 'flashy', expected one of"),
    ("name: t\naxes: {backend: [naive], dtype: [fp8]}\n", "axes.dtype[0]: got 'fp8', expected one of fp32, fp16, bf16"),
    ("name: t\naxes: {backend: [naive], mask: [diagonal]}\n", "axes.mask[0]: got 'diagonal', expected one of none, causal"),
    ("name: t\naxes: {backend: [naive], mask: [{window: 0}]}\n", "axes.mask[0].window: got 0"),
    ("name: t\naxes: {backend: naive}\n", "axes.backend: got 'naive', expected a non-empty list"),
    ("name: t\naxes: {backend: [naive]}\nexclude: [{bias: alibi, typo: 1}]\n", "exclude[0].typo: unknown field"),
    ("name: t\naxes: {backend: [naive]}\nextra: 1\n", "extra: unknown key"),
    ("name: t\naxes: {backend: [naive]}\noptions: {timeout_s: -1}\n", "options.timeout_s: got -1, expected a positive number"),
    ("name: t\naxes: {backend: [naive]}\noptions: {timing: {warmup: x}}\n", "options.timing.warmup: got 'x'"),
    ("axes: {backend: [naive]}\n", "name: got None, expected a non-empty string"),
    ("name: t\naxes: {seqlen_q: [1]}\n", "backend: missing"),
    ("name: t\naxes: [backend, naive]\n", "axes: got list, expected a mapping"),
    ("name: t\naxes: {backend: [naive]\n", "malformed YAML at line"),
    ("- just\n- a list\n", "expected a mapping"),
    ("name: t\naxes: {backend: [naive], seqlen_q: [8]}\nexclude: [{seqlen_q: 8}]\n", "expands to no cases"),
])
def test_every_mistake_names_file_and_field(text, expected):
    with pytest.raises(SweepError) as info:
        parse_sweep(text, "bad.yaml", check_backend_name)
    message = str(info.value)
    assert message.startswith("bad.yaml: ")
    assert expected in message


def test_yaml_tags_that_construct_objects_are_refused():
    text = "name: t\naxes: {backend: [!!python/object/apply:os.system ['true']]}\n"
    with pytest.raises(SweepError, match="malformed YAML"):
        parse_sweep(text, "evil.yaml")


def test_third_party_backend_is_checked_for_form_without_importing_it():
    ok = parse_sweep("name: t\naxes: {backend: ['buggy_backends:ScaledDq']}\n", "t.yaml",
                     check_backend_name)
    assert ok.cases[0].backend == "buggy_backends:ScaledDq"
    # Validating never imports (it would run the module's code): a module that does not exist
    # validates, and its cases become `error` records when they run.
    assert parse_sweep("name: t\naxes: {backend: ['nosuchmodule:X']}\n", "t.yaml",
                       check_backend_name).cases
    with pytest.raises(SweepError, match="expected a third-party backend as 'module:object'"):
        parse_sweep("name: t\naxes: {backend: ['os;rm:x y']}\n", "t.yaml", check_backend_name)


def test_shipped_sweeps_validate():
    for path in sorted((ROOT / "sweeps").glob("*.yaml")):
        assert load_sweep(path, check_backend_name).cases, path


def test_validate_cli_exit_status_and_message(tmp_path, cli_env):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: t\naxes: {backend: [naive], dropout: [2]}\n")
    proc = subprocess.run([*attnbench_cmd(), "validate", str(bad)], capture_output=True,
                          text=True, env=cli_env)
    assert proc.returncode == 2
    assert f"{bad}: axes.dropout[0]: got 2, expected a number in [0, 1)" in proc.stderr
    assert "Traceback" not in proc.stderr
    missing = subprocess.run([*attnbench_cmd(), "validate", str(tmp_path / "none.yaml")],
                             capture_output=True, text=True, env=cli_env)
    assert missing.returncode == 2 and "cannot read sweep file" in missing.stderr
    good = subprocess.run([*attnbench_cmd(), "validate", str(ROOT / "sweeps/smoke.yaml"), "--list"],
                          capture_output=True, text=True, env=cli_env)
    assert good.returncode == 0, good.stderr
    assert "ok: sweep 'smoke'" in good.stdout
