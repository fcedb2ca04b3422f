"""``attnbench history`` end to end on synthetic runs: the steps found where a slowdown was
planted (and the backend's source changed), none elsewhere; runs ordered by commit date,
else by start; one history per GPU kind; JSON and the page; bad input in one line, exit 2."""

import json
import os
import shutil
from pathlib import Path

import pytest

from attnbench.cli import main
from attnbench.report.history.collect import load_history
from attnbench.report.history.order import order_runs
from attnbench.report.history.series import build_histories
from attnbench.report.synthetic import write_synthetic_run

GPU = "H100-SXM5-80GB"
RUNS = 6
SLOW_FROM = 3  # runs 3, 4, 5: triton 30% slower, from new source


def _write(root: Path, i: int, *, gpus=(GPU,), dated: bool = True, **kw) -> Path:
    software = {"commit": f"{i + 1:x}" * 40}
    if dated:
        software["commit_date"] = f"2026-12-0{i + 1}T10:00:00+00:00"
    sha = "a" * 12 if i < SLOW_FROM else "b" * 12
    return write_synthetic_run(
        root / f"run-{(RUNS - i):02d}", gpus=gpus, seed=i, size="small",
        slowdown=1.3 if i >= SLOW_FROM else 1.0, software=software,
        code={"triton": {"module": "attnbench.backends.triton", "source_sha256": sha}},
        created=f"2026-11-{10 + i}T12:00:00Z", **kw)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Six runs whose directory names sort against their history (run-06 is the first)."""
    root = tmp_path_factory.mktemp("history")
    for i in range(RUNS):
        _write(root, i)
    return root


def test_steps_where_the_slowdown_is_and_nowhere_else(runs, capsys):
    assert main(["history", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "6 runs, in commit date order" in out
    histories = build_histories(order_runs(load_history([runs]))[0])
    assert [h.gpu for h in histories] == [GPU]
    steps = histories[0].steps
    assert steps, out
    assert {case.backend for case, _ in steps} == {"triton"}
    assert {(s.metric in ("fwd", "bwd"), s.run, s.before, s.rise) for _, s in steps} == {
        (True, SLOW_FROM, SLOW_FROM - 1, True)}
    assert all(s.code == ["source aaaaaaaaaaaa -> bbbbbbbbbbbb"] for _, s in steps)
    assert all(1.25 < s.step.ratio < 1.35 for _, s in steps)
    timed = [c for c in histories[0].cases if c.backend == "triton" and c.values["fwd"][0] > 0]
    stepped = {c.key for c, _ in steps}
    assert all(c.key in stepped for c in timed)  # every timed triton case stepped
    assert "at r4 (run-03)" in out and "triton code changed: source aaaaaaaaaaaa -> " in out


def test_ordered_by_commit_date_not_by_name(runs):
    ordered, order = order_runs(load_history([runs]))
    assert order == "commit date"
    assert [r.run_id for r in ordered] == [f"run-{RUNS - i:02d}" for i in range(RUNS)]


def test_without_commit_dates_by_start_and_said(tmp_path, capsys):
    for i in range(4):
        _write(tmp_path, i, dated=False)
    ordered, order = order_runs(load_history([tmp_path]))
    assert order == "run start"
    assert [r.run_id for r in ordered] == ["run-06", "run-05", "run-04", "run-03"]
    for path in tmp_path.iterdir():  # no start either: as given
        manifest = json.loads((path / "manifest.json").read_text())
        del manifest["created"]
        (path / "manifest.json").write_text(json.dumps(manifest))
    ordered, order = order_runs(load_history(sorted(tmp_path.iterdir())))
    assert order == "as given" and [r.run_id for r in ordered][0] == "run-03"
    assert main(["history", str(tmp_path)]) == 0
    assert "in as given order" in capsys.readouterr().out


def test_one_history_per_gpu_kind(tmp_path):
    """A run on two kinds is in both histories; a run of another kind is not mixed in."""
    for i in range(4):
        _write(tmp_path, i, gpus=(GPU, "A100-SXM4-80GB") if i == 0 else (GPU,))
    _write(tmp_path / "other", 5, gpus=("H200-SXM-141GB",))
    histories = build_histories(order_runs(load_history([tmp_path, tmp_path / "other"]))[0])
    assert {h.gpu: len(h.runs) for h in histories} == {
        "A100-SXM4-80GB": 1, GPU: 4, "H200-SXM-141GB": 1}


def test_json_holds_every_case_and_step(runs, capsys):
    assert main(["history", str(runs), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["order"] == "commit date" and len(data["runs"]) == RUNS
    (history,) = data["histories"]
    assert history["gpu"] == GPU and history["runs"] == list(range(RUNS))
    steps = [s for c in history["cases"] for s in c["steps"]]
    assert steps and all(s["run"] == SLOW_FROM and s["previous_run"] == SLOW_FROM - 1
                         and s["code_changed"] is True for s in steps)
    assert all(len(c["values"]["fwd"]) == RUNS for c in history["cases"])


def test_page_is_written_and_escapes_what_files_say(runs, tmp_path, capsys):
    copy = tmp_path / "runs"
    shutil.copytree(runs, copy)
    manifest = json.loads((copy / "run-01" / "manifest.json").read_text())
    manifest["run_id"] = "<script>alert(1)</script>"
    (copy / "run-01" / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "page"
    assert main(["history", str(copy), "--out", str(out)]) == 0
    assert f"page: {out / 'index.html'}" in capsys.readouterr().out
    html = (out / "index.html").read_text()
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)" in html
    assert "<svg" in html and "source aaaaaaaaaaaa -&gt; bbbbbbbbbbbb" in html


def test_bad_input_is_one_line_and_exit_2(runs, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "records.jsonl").write_text('{"id": 3\n')
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "records.jsonl")  # a reader that opened it would wait for ever
    for args in ([str(tmp_path / "empty")], [str(tmp_path / "nowhere")], [str(junk)], [str(fifo)],
                 [str(runs), "--threshold", "nan"], [str(runs), str(runs / "run-01")]):
        assert main(["history", *args]) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("attnbench history: ") and err.count("\n") == 1, err


def test_a_folder_of_runs_follows_no_link(runs, tmp_path):
    """A link to a run, or a journal that is a link, inside a folder of runs is not read."""
    folder = tmp_path / "runs"
    shutil.copytree(runs / "run-01", folder / "run-01")
    (folder / "linked").symlink_to(runs / "run-02", target_is_directory=True)
    (folder / "journal-link").mkdir()
    (folder / "journal-link" / "records.jsonl").symlink_to(runs / "run-02" / "records.jsonl")
    assert [r.run_id for r in load_history([folder])] == ["run-01"]
