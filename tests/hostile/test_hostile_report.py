"""Hostile run directories (issue 13): run directories travel between people for ``compare``,
so a journal or manifest may be anything. Every command that reads one (``show``, ``report``,
``compare``, ``run`` resuming it) answers a bad one with one line naming the file, the line and
the field, exit 2, no traceback; every string of a record reaches a page escaped; dashboards
never overwrite or delete files attnbench did not write; a comparison that matched nothing
fails.

Classes covered here: 4 (stored XSS, checked in Chromium too), 9 (journals and manifests),
11 (``--out`` of report and compare), 12 (``compare`` of unrelated runs).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnbench import cli
from attnbench.results.records import make_record
from attnbench.results.store import RunStore
from attnbench.sweep.load import load_sweep
from helpers import DATA

MINIMAL = str(DATA / "minimal.yaml")
SWEEP = """name: crafted
defaults: {backend: naive, batch: 1, seqlen_q: 32, heads_q: 2, head_dim: 16, dtype: fp32}
axes: {seed: [0, 1, 2]}
"""
IMG = '"><img src=x onerror=window.__xss=1>'
"""Fits a case id (64 characters) and every other string field."""
SCRIPT = "<script>window.__xss=2</script>"


def _run(tmp: Path, name: str, *, payload: str = "", seeds=(0, 1, 2),
         verdicts=("pass", "fail", "crash")) -> Path:
    """A run directory made as `attnbench run` makes one, its strings replaced by ``payload``
    where a record or manifest may hold any text."""
    sweep_file = tmp / f"{name}.yaml"
    sweep_file.write_text(SWEEP.replace("seed: [0, 1, 2]", f"seed: {list(seeds)}"))
    out = tmp / name
    store = RunStore(out, load_sweep(sweep_file), command=["attnbench", "run", payload or "x"])
    for case, verdict in zip(store.sweep.cases, verdicts):
        env = {"host": payload or "h", "device": "cpu", "device_name": payload or "cpu",
               "gpu_kind": payload or "cpu"}
        record = make_record(case, verdict=verdict, reason=payload + SCRIPT if payload else "",
                             env=env, crash={"stderr_tail": payload + SCRIPT, "signal": "SIGSEGV",
                                             "exit_code": -11, "rank": 0} if payload else None)
        if payload:
            record.update(label=payload + SCRIPT, features=payload + SCRIPT)
            record["case"]["backend"] = payload
        store.append(record)
    if payload:
        store.set_manifest(run_id=payload, sweep={**store.manifest["sweep"], "name": payload,
                                                  "path": payload + SCRIPT})
    store.close()
    return out


# -- class 4: stored XSS --------------------------------------------------------------------

def test_sort_keys_are_escaped():
    from attnbench.report.page.html import sort_key

    assert sort_key(IMG) == "&quot;&gt;&lt;img src=x onerror=window.__xss=1&gt;"
    assert sort_key(3) == "3.0" and sort_key(None) == "" and sort_key(float("inf")) == "1e308"


def _unescaped(html: str) -> list[str]:
    return [bad for bad in ("<img src=x", "<script>window", IMG) if bad in html]


@pytest.fixture(scope="module")
def crafted_pages(tmp_path_factory) -> dict[str, Path]:
    """A report and a comparison drawn from crafted journals, and a page rendered from records
    that skipped the loader's checks (``case.seqlen_q`` a string, in a ``data-sort``)."""
    from attnbench.report.commands import run_compare, write_report
    from attnbench.report.page.dashboard import load_dashboard
    from attnbench.report.read.reader import run_of_records
    from attnbench.report.page.build import render

    tmp = tmp_path_factory.mktemp("xss")
    a, b = _run(tmp, "a", payload=IMG), _run(tmp, "b", payload=IMG)
    pages = {"report": write_report(a, MINIMAL, tmp / "report")}
    with open(tmp / "summary.txt", "w") as sink:
        run_compare([a, b], out_dir=tmp / "compare", stream=sink)
    pages["compare"] = tmp / "compare" / "index.html"
    records = [json.loads(line) for line in (a / "records.jsonl").read_text().splitlines()]
    for rec in records:
        rec["case"]["seqlen_q"] = rec["case"]["heads_q"] = IMG
    run = run_of_records(a, {"run_id": IMG}, records, IMG)
    (tmp / "raw").mkdir()
    pages["unchecked"] = tmp / "raw" / "index.html"
    pages["unchecked"].write_text(render(run, load_dashboard(MINIMAL), []))
    return pages


@pytest.mark.parametrize("name", ["report", "compare", "unchecked"])
def test_crafted_strings_reach_pages_escaped(crafted_pages, name):
    html = crafted_pages[name].read_text()
    assert "window.__xss" in html  # the payload is on the page, as text
    assert _unescaped(html) == []


@pytest.mark.parametrize("name", ["report", "compare", "unchecked"])
def test_no_crafted_script_runs_in_a_browser(crafted_pages, name):
    import headless_chromium as chrome

    if chrome.CHROMIUM is None:
        pytest.skip("chromium is not installed: apt-get install -y chromium")
    browser = chrome.Browser(crafted_pages[name].parent.parent / f"profile-{name}")
    try:
        browser.open(crafted_pages[name].as_uri())
        browser.js("document.querySelectorAll('table.sortable thead th')"
                   ".forEach(th => { th.click(); th.click(); })")  # sorting reads data-sort
        assert browser.js("typeof window.__xss") == "undefined"
        assert browser.js("document.querySelectorAll('img[src=\"x\"], script:not(:last-of-type)')"
                          ".length") == 0
        assert IMG in browser.js("document.body.innerText")
    finally:
        browser.close()


# -- class 9: any journal or manifest: one line, exit 2 -----------------------------------------

JOURNALS = {
    "a number": (b"42\n", "records.jsonl:1: got 42, expected a record"),
    "a list": (b"[]\n", "records.jsonl:1: got [], expected a record"),
    "an empty object": (b"{}\n", "records.jsonl:1: id: got None, expected a case id"),
    "not UTF-8": (b'{"id": "\xff\xfe"}\n', "records.jsonl:1: not UTF-8 text"),
    "no case": (b'{"id": "x", "verdict": "pass"}\n', "records.jsonl:1: case: got None"),
    "no verdict": (None, "records.jsonl:1: verdict: got None, expected one of pass"),
    "cp a string": (None, "records.jsonl:1: case.cp: got 'x', expected an integer"),
    "NaN": (None, "records.jsonl:1: not a JSON record (NaN is not a JSON number)"),
    "1e999": (None, "records.jsonl:1: not a JSON record (1e999 is out of range)"),
    "timing a list": (None, "records.jsonl:1: timing: got [1], expected an object"),
    "gpu kind a number": (None, "records.jsonl:1: env.gpu_kind: got 7, expected a string"),
    "deep": (b"[" * 100_000 + b"]" * 100_000 + b"\n", "records.jsonl:1: not a JSON record"),
    "a directory": (None, "records.jsonl: not a file"),
}
MANIFESTS = {
    "a list": (b"[]", "manifest.json: got [], expected a JSON object"),
    "sweep a list": (b'{"sweep": []}', "manifest.json: sweep: got [], expected an object"),
    "hosts a string": (b'{"hosts": "h"}', "manifest.json: hosts: got 'h', expected a list"),
    "run_id a number": (b'{"run_id": 5}', "manifest.json: run_id: got 5, expected a string"),
    "options": (b'{"options": {"timeout_s": "x"}}', "options.timeout_s: got 'x'"),
    "not JSON": (b"{", "manifest.json: not valid JSON"),
    "a directory": (None, "manifest.json: cannot read"),
}


def _good_line(run: Path) -> dict:
    return json.loads((run / "records.jsonl").read_text().splitlines()[0])


def _break(run: Path, kind: str, name: str) -> None:
    table = JOURNALS if kind == "journal" else MANIFESTS
    path = run / ("records.jsonl" if kind == "journal" else "manifest.json")
    raw = table[name][0]
    if name == "a directory":
        path.unlink()
        path.mkdir()
        return
    if raw is None:
        rec = _good_line(run)
        if name == "no verdict":
            del rec["verdict"]
        elif name == "cp a string":
            rec["case"]["cp"] = "x"
        elif name == "timing a list":
            rec["timing"] = [1]
        elif name == "gpu kind a number":
            rec["env"]["gpu_kind"] = 7
        raw = json.dumps(rec).encode()
        raw = raw.replace(b'"duration_s": 0.0', b'"duration_s": NaN') if name == "NaN" else raw
        raw = raw.replace(b'"duration_s": 0.0', b'"duration_s": 1e999') if name == "1e999" else raw
        raw += b"\n"
    path.write_bytes(raw)


@pytest.fixture(scope="module")
def good_run(tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("good"), "good")


@pytest.mark.parametrize("kind, name", [("journal", n) for n in JOURNALS]
                         + [("manifest", n) for n in MANIFESTS])
def test_every_command_answers_a_bad_run_directory_in_one_line(tmp_path, capsys, good_run, kind,
                                                               name):
    run = _run(tmp_path, "crafted")
    _break(run, kind, name)
    expected = (JOURNALS if kind == "journal" else MANIFESTS)[name][1]
    if expected.startswith(("records.jsonl", "manifest.json")):
        expected = f"{run}/{expected}"
    before = sorted(p.name for p in run.iterdir())
    commands = {"show": ["show", str(run), "--all"],
                "report": ["report", str(run), "--dashboard", MINIMAL, "--out",
                           str(tmp_path / "dash")],
                "compare": ["compare", str(good_run), str(run), "--no-dashboard"],
                "history": ["history", str(good_run), str(run)],
                "run": ["run", str(tmp_path / "crafted.yaml"), "--out", str(run), "--no-report"]}
    for command, args in commands.items():
        rc = cli.main(args)
        err = capsys.readouterr().err
        assert rc == 2, (command, err)
        assert err.count("\n") == 1 and "Traceback" not in err and len(err) < 1000, (command, err)
        assert expected in err, (command, err)
    assert sorted(p.name for p in run.iterdir()) == before
    assert not (tmp_path / "dash").exists()


# -- class 11: dashboards never overwrite what attnbench did not write ------------------------

def test_report_and_compare_refuse_a_directory_of_user_files(tmp_path, capsys, good_run):
    mine = tmp_path / "mine"
    mine.mkdir()
    files = {"index.html": "<p>my page</p>", "p01-plan.svg": "<svg/>", "c1-photo.png": "png"}
    for name, text in files.items():
        (mine / name).write_text(text)
    assert cli.main(["report", str(good_run), "--dashboard", MINIMAL, "--out", str(mine)]) == 2
    other = _run(tmp_path, "other")
    assert cli.main(["compare", str(good_run), str(other), "--out", str(mine)]) == 2
    err = capsys.readouterr().err
    assert f"{mine}: not empty and not a dashboard attnbench wrote" in err
    assert {p.name: p.read_text() for p in mine.iterdir()} == files


def test_a_dashboard_directory_is_redrawn_keeping_files_added_to_it(tmp_path, good_run):
    from attnbench.report.commands import write_report

    out = tmp_path / "dash"
    write_report(good_run, MINIMAL, out)
    drawn = {p.name for p in out.iterdir()}
    assert ".attnbench-dashboard" in drawn and "index.html" in drawn
    (out / "p07-my-notes.svg").write_text("<svg/>")
    write_report(good_run, MINIMAL, out)
    assert {p.name for p in out.iterdir()} == drawn | {"p07-my-notes.svg"}


# -- class 12: a comparison that matched nothing fails ------------------------------------------

def test_compare_of_unrelated_runs_exits_2(tmp_path, capsys, good_run):
    unrelated = _run(tmp_path, "unrelated", seeds=(7, 8, 9))
    assert cli.main(["compare", str(good_run), str(unrelated), "--no-dashboard"]) == 2
    err = capsys.readouterr().err
    assert err == (f"attnbench compare: RUN: {unrelated} (3 cases) shares no case with the "
                   f"baseline {good_run} (3 cases): nothing to compare (runs of different "
                   "sweeps?)\n")
    related = _run(tmp_path, "related", seeds=(0, 7, 8))
    assert cli.main(["compare", str(good_run), str(related), "--no-dashboard"]) in (0, 1)


# -- issue 41 item 8: control characters in an export ---------------------------------------
TERMINAL = "\x1b]0;pwned\x07\x1b[2J\x1b[31mred\rover\u202eevil\nline"
"""A title change, a screen clear, a colour, a carriage return, a bidi override, a newline."""


@pytest.mark.parametrize("path", ["rows", "frames"])
def test_export_csv_escapes_control_characters_as_show_does(tmp_path, capsysbinary,
                                                            monkeypatch, path):
    """The old CSV wrote a record's text raw: ``cat cases.csv`` ran the escape sequences. Both
    ways CSV is written (from rows, and from frames where rows are irregular) escape them as
    :func:`~attnbench.errors.printable` does; JSON escapes them itself."""
    from attnbench.errors import printable
    from attnbench.report.export import command

    if path == "frames":
        monkeypatch.setattr(command, "from_rows", lambda *a, **k: None)
    sweep_file = tmp_path / "esc.yaml"
    sweep_file.write_text(SWEEP)
    run = tmp_path / "esc"
    store = RunStore(run, load_sweep(sweep_file), command=["attnbench", "run"])
    for case in store.sweep.cases:
        record = make_record(case, verdict="fail", reason=TERMINAL + SCRIPT,
                             env={"host": TERMINAL, "device": "cpu"})
        store.append({**record, "label": TERMINAL})
    store.close()
    assert cli.main(["export", str(run), "--format", "csv"]) == 0
    out = capsysbinary.readouterr().out
    assert not [c for c in out.decode("utf-8") if not c.isprintable() and c != "\n"]
    assert printable(TERMINAL + SCRIPT).encode("utf-8") in out
    assert out.count(b"\n") == 4  # the header and three rows: no newline inside a cell
    assert cli.main(["export", str(run), "--format", "json"]) == 0
    assert b"\x1b" not in capsysbinary.readouterr().out
