"""A run whose cases are forward only (``backward: false``, decode, fp8 -- every flex case on a
CPU) draws no empty backward subplot beside its throughput (issue 27), and says why."""

from __future__ import annotations

import json
import shutil

from attnbench.report.page.dashboard import default_dashboard
from attnbench.report.read.reader import read_run
from attnbench.report.page.figures import Context
from attnbench.report.page.panels import draw_panel


def _throughput(run_dir, out_dir):
    panel = next(p for p in default_dashboard().panels if p.kind == "throughput")
    out_dir.mkdir(parents=True)
    return draw_panel(panel, read_run(run_dir), Context(out_dir=out_dir))


def test_a_forward_only_run_draws_no_backward_subplot(tiny, tmp_path):
    both = _throughput(tiny, tmp_path / "both")
    # the control: a run with backward timings draws it
    assert any("backward" in f.svg.read_text() for f in both.figures)
    fwd_only = tmp_path / "fwd-only"
    shutil.copytree(tiny, fwd_only, ignore=shutil.ignore_patterns("dashboard", ".lock"))
    lines = []
    for line in (fwd_only / "records.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("timing"):
            rec["timing"]["bwd"] = None
        lines.append(json.dumps(rec))
    (fwd_only / "records.jsonl").write_text("\n".join(lines) + "\n")
    out = _throughput(fwd_only, tmp_path / "fwd")
    assert out.figures and not any("backward" in f.svg.read_text() for f in out.figures)
    assert "No case here timed the backward (forward-only cases): not drawn." in out.notes
