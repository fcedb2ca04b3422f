"""``attnbench report``: figures and page from real records (a tiny sweep run through the CLI)
and from synthetic GPU records (the seed bugs, GPU kinds, parity); dashboard files and their
errors; escaping. About 40 s on 2 cores (matplotlib rendering dominates)."""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import pytest

from attnbench.report import commands
from attnbench.report.page.dashboard import PANEL_KINDS, default_dashboard, load_dashboard
from attnbench.report.read.reader import read_run
from attnbench.results.store import load_records
from attnbench.report.page.figures import slug as _slug
from attnbench.report.page.panels.accuracy_heatmap import heatmap_figure, heatmap_rows, over_cmap
from attnbench.results.records import SEVERITY, TENSORS
from matplotlib.colors import LogNorm


import report_runs as runs  # tests/support/ is on sys.path (pyproject: pythonpath)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _figures(index: Path) -> list[str]:
    return re.findall(r'<img src="([^"]+)"', index.read_text())


def _check_figures(index: Path) -> list[str]:
    """Every referenced image exists as a PNG with its SVG beside it."""
    pngs = _figures(index)
    for name in pngs:
        png = index.parent / name
        assert png.read_bytes()[:8] == PNG_MAGIC, name
        svg = png.with_suffix(".svg")
        assert svg.exists() and b"<svg" in svg.read_bytes()[:2000], svg
        assert f'href="{svg.name}"' in index.read_text()
    return pngs


# --------------------------------------------------------------------------------------------
# real records


def test_report_of_a_real_run(base, tiny):
    index = runs.report(base, "tiny", tiny)
    page = index.read_text()
    records = load_records(tiny)
    assert records, "the tiny sweep recorded nothing"
    pngs = _check_figures(index)

    # one table row per record, every id on the page
    table = page.split('id="all-records"', 1)[1]
    assert table.count("<tr data-verdict=") == len(records)
    for rec in records:
        assert rec["id"] in table
    # panels drawn from what the records hold
    assert any(p.startswith("p00-verdict-matrix") for p in pngs)
    assert any("accuracy-heatmap" in p for p in pngs)
    if any((r.get("timing") or {}).get("fwd") for r in records):
        assert any("throughput" in p for p in pngs), "timed records but no throughput figure"
    if any((r.get("accuracy") or {}).get("tensors") for r in records):
        assert any("error-vs-seqlen" in p for p in pngs)
    if not any(c.get("check") == "parity" for r in records for c in r.get("checks") or []):
        assert "No parity plot" in page
    # a CPU run has no percent of peak: said, not drawn
    if all((r.get("timing") or {}).get("fwd", {}).get("pct_peak") is None for r in records):
        assert "No percent-of-peak axis" in page

    # the crash of testing.segfault is a failure with the command that reruns it alone
    crash = next(r for r in records if r["case"]["backend"] == "testing.segfault")
    assert crash["verdict"] == "crash"
    failures = page.split('id="failures"', 1)[1].split('id="all-records"', 1)[0]
    assert html.escape(f"attnbench run {runs.TINY_SWEEP} --case {crash['id']}") in failures
    # run header: sweep, where, versions, totals
    header = page.split("</header>", 1)[0]
    manifest = json.loads((tiny / "manifest.json").read_text())
    assert manifest["sweep"]["name"] in header and manifest["versions"]["torch"] in header
    assert "1 crash" in header


def test_cli_report_prints_the_index_path(tiny, tmp_path, capsys):
    from attnbench.cli import main

    assert main(["report", str(tiny), "--out", str(tmp_path / "r"),
                 "--dashboard", str(runs.DATA / "minimal.yaml")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "r" / "index.html")


def test_default_out_dir_is_beside_the_run_never_in_the_nearest_project(tiny, tmp_path,
                                                                         monkeypatch):
    """Run from inside some other project (a pyproject.toml and a dashboards/ folder above the
    current directory): the dashboard lands in RUN/dashboard/ and the project is untouched."""
    run = tmp_path / "runs" / "mine"
    shutil.copytree(tiny, run)
    other = tmp_path / "other-project"
    (other / "dashboards").mkdir(parents=True)
    (other / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (other / "sub").mkdir()
    monkeypatch.chdir(other / "sub")
    index = commands.write_report(run)
    assert index == run / "dashboard" / "index.html" and index.is_file()
    assert sorted(p.name for p in other.rglob("*")) == ["dashboards", "pyproject.toml", "sub"]


# --------------------------------------------------------------------------------------------
# synthetic GPU records: all panels, the seed bugs


def test_report_of_a_gpu_run_draws_every_panel(base, synthetic):
    index = runs.report(base, "mixed", synthetic["mixed"])
    pngs = _check_figures(index)
    page = index.read_text()
    for kind in PANEL_KINDS:
        if kind in ("decode", "fp8"):
            continue  # no decode or fp8 case in the synthetic runs: their tests draw them
        slug = kind.replace("_", "-")
        assert any(slug in p for p in pngs), f"no figure for panel {kind}"
    assert any("parallel-parity" in p for p in pngs) and any("parallel-speedup" in p for p in pngs)
    assert any(re.search(r"architecture-a100-vs-h100", p) for p in pngs)
    assert "H100" in page.split("</header>")[0] and "A100" in page.split("</header>")[0]


def test_report_names_the_hardware_and_never_shows_timed_as_a_pass(base, synthetic):
    """A speed-only run on an exact kind: the header names the card and the software, "timed"
    reads "not judged" everywhere, GB/s and peak memory sit beside TFLOP/s, and the timings
    that never settled are badged in the table and hollow / hatched in the figures."""
    index = runs.report(base, "sxm-timed", synthetic["sxm-timed"])
    pngs = _check_figures(index)
    page = index.read_text()
    header = html.unescape(page.split("</header>", 1)[0])
    for fact in ("H100-SXM5-80GB (family H100): NVIDIA H100 80GB HBM3, SXM", "132 SMs",
                 "SM clock max 1980 MHz", "memory clock max 2619 MHz", "power limit 700 W",
                 "driver 550.54.15 (CUDA 12.4)", "CUDA runtime 12.4", "torch 2.5.1+cu124",
                 "commit 0123456789ab", "1 device(s), 84 record(s)"):
        assert fact in header, fact
    records = load_records(synthetic["sxm-timed"])
    n_timed = sum(r["verdict"] == "timed" for r in records)
    assert n_timed and f"{n_timed} not judged" in header
    assert not re.search(r">\d+ timed<", page) and ">timed<" not in page
    summary = html.unescape(page.split('id="summary"', 1)[1].split("</section>", 1)[0])
    assert f"{n_timed} of {len(records)} cases are" in summary and "not passes" in summary
    assert "passed or were not applicable" not in summary
    assert "ran with accuracy: false" in html.unescape(page)  # the heatmap's note

    table = page.split('id="all-records"', 1)[1]
    assert "<th>fwd GB/s</th>" in table and ">peak mem</th>" in table
    noisy = sum(bool(r["timing"]["fwd"]["noisy"]) + bool(r["timing"]["bwd"]["noisy"])
                for r in records if r.get("timing"))
    assert noisy and table.count('class="badge noisy"') == noisy
    assert re.search(r"\d GiB / [\d.]+ GiB</td>", table)  # peak memory, forward / backward
    matrix = (index.parent / "p00-verdict-matrix.svg").read_text()
    assert "not judged" in matrix and not re.search(r">\d+ timed<", matrix)
    throughput = " ".join((index.parent / p).with_suffix(".svg").read_text() for p in pngs
                          if "throughput" in p)
    assert "hollow: noisy" in throughput or "hatched: noisy" in throughput
    assert "Achieved bandwidth" in page and "GB/s" in page


THROUGHPUT_ONLY = "title: t\npanels:\n  - kind: throughput\n    {filter}\n"


def _run_subset(src: Path, dst: Path, keep) -> Path:
    """A copy of run ``src`` with only the records for which ``keep(record)`` is true."""
    dst.mkdir(parents=True)
    shutil.copy(src / "manifest.json", dst / "manifest.json")
    lines = [line for line in (src / "records.jsonl").read_text().splitlines()
             if keep(json.loads(line))]
    (dst / "records.jsonl").write_text("\n".join(lines) + "\n")
    return dst


def _throughput_report(run: Path, out: Path, extra: str = "",
                       filter: str = "filter: {world_size: 1}") -> tuple[str, list[str]]:
    """A dashboard of one throughput panel (``extra``: more of its options) drawn for ``run``:
    the page and its figures."""
    dash = out.parent / f"{out.name}.yaml"
    dash.write_text(THROUGHPUT_ONLY.format(filter=filter) + extra)
    index = commands.write_report(run, dash, out)
    return index.read_text(), _check_figures(index)


def test_single_seqlen_facets_fold_into_one_bar_chart_per_gpu_and_dtype(synthetic, tmp_path):
    # a run at one sequence length, as a smoke run on CPU: no one-point line plots
    run = _run_subset(synthetic["mixed"], tmp_path / "one-len",
                      lambda r: r["case"]["seqlen_q"] == 4096)
    page, pngs = _throughput_report(run, tmp_path / "out1")
    frame = read_run(run).frame
    single = frame[(frame.world_size == 1) & frame.verdict.isin(["pass", "fail"])]
    kinds = sorted({(g.lower(), d) for g, d in zip(single.gpu_kind, single.dtype)})
    assert pngs == [f"p00-throughput-bars-{g}-{d}.png" for g, d in kinds], pngs
    assert f"were measured at a single seqlen_q: they are folded into {len(kinds)} bar" in page
    said = 0
    for gpu, dtype in kinds:
        svg = (tmp_path / "out1" / f"p00-throughput-bars-{gpu}-{dtype}.svg").read_text()
        rows = single[(single.gpu_kind.str.lower() == gpu) & (single.dtype == dtype)]
        for feature in set(rows.features):  # one row per feature combination
            assert f">{html.escape(feature)}<" in svg, feature
        for backend in set(rows.backend):  # bars (and legend) per backend
            assert html.escape(backend) in svg, backend
        assert "% of peak" in svg  # synthetic GPU records carry pct_peak
        # a backend without numbers for a row says why instead of leaving a blank
        dead = frame[(frame.gpu_kind.str.lower() == gpu) & (frame.world_size == 1)
                     & frame.verdict.isin(["unsupported", "crash"])]
        for r in dead.itertuples():
            if r.features in set(rows.features):
                assert f"{html.escape(r.backend)}: {r.verdict}" in svg
                said += 1
    assert said, "no unsupported case in a bar chart row: the test lost its point"

    # one combination at three lengths keeps its line plot; the rest stay bars, whose caption
    # says where that combination went
    lined = ("H100", "MHA causal")
    run2 = _run_subset(synthetic["mixed"], tmp_path / "one-curve", lambda r: (
        r["case"]["seqlen_q"] == 4096 or (r["env"]["gpu_kind"], r["features"]) == lined))
    page2, pngs2 = _throughput_report(run2, tmp_path / "out2")
    lines = [p for p in pngs2 if "-bars-" not in p]
    assert lines == ["p00-throughput-h100-bf16-mha-causal.png"], pngs2
    assert sorted(p for p in pngs2 if "-bars-" in p) == sorted(pngs)
    assert "Not here: 1 combination(s) measured at several seqlen_q, drawn as line plots " \
           "(MHA causal)" in page2
    bars_h100 = (tmp_path / "out2" / "p00-throughput-bars-h100-bf16.svg").read_text()
    assert ">MHA causal<" not in bars_h100 and ">MHA causal alibi<" in bars_h100


def test_line_plots_are_capped_with_a_note_naming_the_rest(synthetic, tmp_path):
    import yaml

    page, pngs = _throughput_report(synthetic["mixed"], tmp_path / "out", "    max_figures: 3\n")
    lines = [p for p in pngs if "-bars-" not in p]
    assert len(lines) == 3
    # spread over the GPU kinds rather than the first three of one
    assert {p.split("-")[2] for p in lines} == {"a100", "h100"}
    frame = read_run(synthetic["mixed"]).frame
    timed = frame[(frame.world_size == 1) & frame.verdict.isin(["pass", "fail"])]
    curves = (timed.groupby(["gpu_kind", "dtype", "features"]).seqlen_q.nunique() >= 2).sum()
    note = re.search(r"(\d+) more line plots not drawn \((.*?)\): this panel draws at most "
                     r"max_figures=3.*?for example (filter: \{.*?\})\)", html.unescape(page))
    assert note and int(note.group(1)) == curves - 3, page
    # the example is a filter: line for the YAML (the panel's own filter kept) that brings
    # back the first plot left out
    hidden = note.group(2).split(", ")[0]  # "A100 · bf16 · MHA none"
    example = yaml.safe_load(note.group(3))["filter"]
    assert example == {"world_size": [1], "features": [hidden.split(" · ")[-1]]}
    _, pngs2 = _throughput_report(synthetic["mixed"], tmp_path / "narrow", "    max_figures: 3\n",
                                  filter=note.group(3))
    assert f"p00-throughput-{_slug(hidden.replace(' · ', ' '))}.png" in pngs2, (hidden, pngs2)


def _seed_rows(frame):
    """The rows of the three seed bugs planted by attnbench.report.synthetic."""
    te = frame.backend == "transformer_engine"
    return {
        "000 CP backward segfault": frame[te & (frame.cp > 1) & (frame["mask"] == "none")
                                          & (frame.dropout > 0)],
        "001 TE dQ wrong": frame[te & (frame.dtype == "bf16") & (frame.dropout == 0)
                                 & (frame.softcap == 0) & (frame.world_size == 1)],
        "004 MQA ALiBi layout": frame[(frame.backend == "triton") & (frame.heads_kv == 1)
                                      & (frame.bias == "alibi")],
    }


def test_seed_bugs_jump_out_of_the_accuracy_heatmap(synthetic):
    run = read_run(synthetic["h100"])
    seeds = _seed_rows(run.frame)
    rows = run.frame.sort_values("label")
    fig = heatmap_figure(rows, list(TENSORS), LogNorm(1e-2, 1e2), over_cmap(), annotate=False)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    # text written in each cell, by (row, column); a dead case is one text across the row
    cell_text = {(int(t.get_position()[1]), t.get_position()[0]): t.get_text() for t in ax.texts}

    def texts_of(label):
        i = labels.index(label)
        return {x: s for (row, x), s in cell_text.items() if row == i}

    for name, df in seeds.items():
        assert len(df), f"seed {name} missing from the synthetic run"
        for r in df.itertuples():
            texts = texts_of(r.label)
            if name.startswith("000"):
                assert r.verdict == "crash"
                assert list(texts.values()) == ["CRASH SIGSEGV"], (name, texts)
            elif name.startswith("001"):
                assert r.verdict == "fail"
                # only dQ (column 1) is over its bound, by far
                assert set(texts) == {1.5} and float(texts[1.5]) > 10, (name, texts)
            else:
                assert r.verdict == "fail"
                assert set(texts) == {0.5, 1.5, 2.5, 3.5}, (name, texts)
            tick = ax.get_yticklabels()[labels.index(r.label)]
            assert tick.get_color() != "black" and tick.get_fontweight() == "bold"
    # cases that passed carry no text (nothing over 1) and plain labels
    passed = rows[rows.verdict == "pass"]
    assert all(not texts_of(label) for label in passed.label)


def test_default_heatmap_puts_the_worst_verdicts_first(synthetic):
    panel = next(p for p in load_dashboard(runs.ROOT / "dashboards" / "default.yaml").panels
                 if p.kind == "accuracy_heatmap")
    assert panel["sort"] == "verdict"
    rows = heatmap_rows(panel, read_run(synthetic["h100"]))
    ranks = [SEVERITY.index(v) for v in rows.verdict]
    assert ranks == sorted(ranks) and rows.verdict.iloc[0] == "fail"
    assert "unsupported" not in set(rows.verdict)  # excluded by the default dashboard
    assert {"crash", "timeout", "oom", "error"} <= set(rows.verdict)


# --------------------------------------------------------------------------------------------
# dashboards


def test_default_dashboard_file_matches_the_built_in_panels():
    spec = load_dashboard(runs.ROOT / "dashboards" / "default.yaml")
    # the same panels (the file orders them for reading)
    assert sorted(p.kind for p in spec.panels) == sorted(p.kind for p in default_dashboard().panels)
    throughput = [p for p in spec.panels if p.kind == "throughput"]
    built_in = [p for p in default_dashboard().panels if p.kind == "throughput"]
    assert throughput[0].include == {"world_size": [1]}
    assert throughput[1].include == {"packed": [True], "world_size": [1]}
    assert throughput[1]["x"] == "tokens"
    for mine, theirs in zip(throughput, built_in):  # memory-bound decode: GB/s in its own panel
        assert mine.exclude == theirs.exclude == {"decode": [True]}


@pytest.mark.parametrize("text, where", [
    ("panels: [", "malformed YAML at line 1"),
    ("title: x\n", "panels: got None"),
    ("panels:\n  - kind: pie\n", "panels[0].kind: got 'pie'"),
    ("panels:\n  - kind: throughput\n    facets: [colour]\n", "panels[0].facets[0]: got 'colour'"),
    ("panels:\n  - kind: throughput\n    max_figures: -1\n", "panels[0].max_figures: got -1"),
    ("panels:\n  - kind: verdict_matrix\n    filter: {nope: 1}\n", "panels[0].filter.nope"),
    ("panels:\n  - kind: accuracy_heatmap\n    sort: random\n", "panels[0].sort: got 'random'"),
    ("panels:\n  - kind: accuracy_heatmap\n    tensors: [dx]\n", "panels[0].tensors[0]: got 'dx'"),
    ("panels:\n  - kind: parallel\n    colour: red\n", "panels[0].colour: unknown option"),
    ("panels:\n  - {kind: parallel}\ntable: {filters: [colour]}\n", "table.filters[0]"),
    ("panels:\n  - {kind: parallel}\nextra: 1\n", "extra: unknown key"),
])
def test_malformed_dashboard_is_exit_2_naming_file_and_field(tiny, tmp_path, capsys, text, where):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    rc = commands.main(["report", str(tiny), "--dashboard", str(bad), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2
    assert str(bad) in err and where in err, err
    assert "Traceback" not in err


def test_run_without_records_is_exit_2(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    assert commands.main(["report", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "run" / "records.jsonl") in err and "Traceback" not in err
    assert commands.main(["report", str(tmp_path / "nowhere")]) == 2
    assert "no such run directory" in capsys.readouterr().err


def test_broken_record_line_is_exit_2_naming_the_line(tiny, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(tiny, run)
    lines = (run / "records.jsonl").read_text().splitlines()
    lines.insert(1, "{not json")
    (run / "records.jsonl").write_text("\n".join(lines) + "\n")
    assert commands.main(["report", str(run), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "records.jsonl:2" in err and "Traceback" not in err


def test_torn_last_line_is_ignored(tiny, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny, run)
    with open(run / "records.jsonl", "a") as fh:
        fh.write('{"id": "torn", "case": {')
    assert len(read_run(run).frame) == len(read_run(tiny).frame)


# --------------------------------------------------------------------------------------------
# escaping


def test_case_strings_are_escaped_in_page_and_figures(tiny, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny, run)
    nasty = '<script>alert("x")</script> $a$ & \'q\''
    records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    for rec in records:
        rec["case"]["backend"] = nasty  # through legends, ticks, table, filters
        rec["label"] = nasty + " " + rec["label"]
        rec["features"] = nasty
        if rec["verdict"] != "pass":
            rec["reason"] = nasty
        env = rec.setdefault("env", {})  # the hardware identity in the header
        env.update(gpu_kind=env.get("gpu_kind") or "cpu", torch=nasty,
                   identity={**(env.get("identity") or {}), "name": nasty, "sm_count": 3},
                   software={**(env.get("software") or {}), "torch": nasty, "commit": nasty})
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["sweep"]["name"] = nasty
    manifest["sweep"]["path"] = "sweeps/<odd> name.yaml"
    (run / "manifest.json").write_text(json.dumps(manifest))

    index = commands.write_report(run, None, tmp_path / "out")
    page = index.read_text()
    assert "<script>alert" not in page
    assert html.escape(nasty) in page
    header = page.split("</header>", 1)[0]
    assert f"{html.escape(nasty)}, 3 SMs" in header and f"torch {html.escape(nasty)}" in header
    # the repro command quotes the odd path for a shell, then escapes it for HTML
    assert html.escape("attnbench run 'sweeps/<odd> name.yaml' --case") in page
    _check_figures(index)  # "$a$" did not break matplotlib (mathtext)
    svg = next(index.parent.glob("*verdict-matrix.svg")).read_text()
    assert "$a$" in svg and "&lt;script&gt;" in svg


def test_identity_and_parity_failures_are_heatmap_cells():
    """A case judged only by identities (hidden dropout mask) must still be a red cell."""
    from attnbench.report.read.data import flatten

    record = {
        "id": "x", "case": {"backend": "b", "cp": 2, "tp": 1, "heads_q": 8, "heads_kv": 8},
        "verdict": "fail", "label": "b", "features": "MHA",
        "accuracy": {"reference": "none: hidden", "tensors": {},
                     "identities": {"dv_v": {"value": 0.48, "bound": 0.012},
                                    "dq_q": {"value": 0.001, "bound": 0.012},
                                    "dk_sum": {"value": 0.6, "bound": 0.03}},
                     "parity": {"dq": {"rel_l2": 0.5, "bound": None}}},
    }
    row = flatten(record)
    assert row["dv_v_over"] == pytest.approx(40.0) and row["dk_sum_over"] == pytest.approx(20.0)
    assert row["worst_over"] == pytest.approx(40.0)
    assert row["parity_over"] != row["parity_over"]  # NaN: parity without a bound is not judged
