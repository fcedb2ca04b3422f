"""The report's summary says what the failing cases share, the lines ``attnbench show`` prints
(issue 39 item 7), escaped: a backend's name and a case's values come from the records. Also
read by several processes (``report --jobs``): the readers' tallies merge to the same lines."""

import html
from pathlib import Path

from attnbench.report.page.build import common_html, summary_section
from attnbench.report.page.dashboard import default_dashboard
from attnbench.report.read.reader import RunReader, run_of, run_of_records
from attnbench.report.show.summary import RunSummary
from attnbench.results.records import make_record
from attnbench.sweep.case import make_case

NASTY = '<script>alert("x")</script>&'


def _records(backend="mutant.gqa_dkv_mean"):
    out = []
    for heads_kv in (4, 2):
        for seed in range(3):
            case = make_case("html", {"backend": backend, "dtype": "bf16", "heads_q": 4,
                                      "heads_kv": heads_kv, "seed": seed})
            bad = heads_kv == 2
            checks = [{"check": "reference", "tensor": t, "metric": "rel_l2", "value": 1.0,
                       "bound": 1.0, "passed": not (bad and t in ("dk", "dv"))}
                      for t in ("out", "dq", "dk", "dv")]
            out.append(make_record(case, verdict="fail" if bad else "pass", checks=checks,
                                   reason="dk over its bound" if bad else "", env={}))
    return out


def test_the_summary_section_carries_the_shared_features():
    records = _records()
    run = run_of_records(Path("run"), {"run_id": "html"}, records)
    assert run.commonality == RunSummary.of(records).common_text()
    section = html.unescape(summary_section(run, default_dashboard()))
    assert "What the failing cases share:" in section
    assert ("mutant.gqa_dkv_mean: 3 of 6 cases fail; 3 of 3 failures are heads_kv=2 (every "
            "such case fails); only dK/dV fail; out, dQ are clean") in section
    clean = run_of_records(Path("run"), {"run_id": "clean"}, [r for r in records
                                                              if r["verdict"] == "pass"])
    assert clean.commonality == [] and "share" not in summary_section(clean, default_dashboard())


def test_the_lines_are_escaped():
    records = _records(backend=NASTY)
    for r in records:  # a hostile record's value
        r["case"]["inputs"] = NASTY if r["verdict"] == "fail" else "normal"
    run = run_of_records(Path("run"), {"run_id": "nasty"}, records)
    section = summary_section(run, default_dashboard())
    assert "<script>" not in section
    assert html.escape(f"{NASTY}: 3 of 6 cases fail") in section
    assert html.escape(f"inputs={NASTY}") in section
    assert common_html([]) == ""


def test_readers_of_ranges_merge_to_the_lines_of_one():
    records = _records()
    first, second = RunReader("r"), RunReader("r", start=4)
    for r in records[:4]:
        first.add(r)
    for r in records[4:]:
        second.add(r)
    first.merge(second)
    merged = run_of(first, Path("run"), {"run_id": "r"})
    assert merged.commonality == RunSummary.of(records).common_text() != []
