"""``attnbench show`` from a journal's Arrow columns (report/show/columns.py, issue 44): the
same text as from its records one by one, and the columns taken where the journal is clean.

The journal mixes what a summary reads otherwise: records counted by column (passes of several
backends, GPU kinds and head counts, a ``timed`` and an ``unsupported``), failures (listed in
order, what they share), judged records with tensors (error series, a finding), a failure
without a reason and one with a null label (printed as the per-line path prints them)."""

import json

import pytest

import attnbench.results.columnar as columnar
from attnbench import cli
from attnbench.report.show.columns import add_block
from attnbench.report.show.summary import RunSummary
from attnbench.results.columnar import RecordBlock, last_record_blocks
from attnbench.results.records import TENSORS, make_record
from attnbench.sweep.case import make_case
from helpers import simulated_record

pytest.importorskip("pyarrow")


def _judged(verdict="pass", failing=(), *, seqlen=256, error=2e-3, **fields):
    """A judged record (as tests/report/show/test_failure_summary.py's): ``failing`` tensors
    fail their reference check; ``error``: dQ's (the fused baseline's is 2e-3)."""
    case = make_case("columns", {"backend": "mutant.gqa_dkv_mean", "dtype": "bf16",
                                 "heads_q": 4, "seqlen_q": seqlen, **fields})
    tensors = {t: {"rel_l2": 2e-3, "fused_rel_l2": 2e-3, "baseline": "fused"} for t in TENSORS}
    tensors["dq"]["rel_l2"] = error
    checks = [{"check": "reference", "tensor": t, "metric": "rel_l2", "value": 1.0,
               "bound": 1.0, "passed": t not in failing} for t in tensors]
    return make_record(case, verdict=verdict, reason="dk rel_l2 0.5 > bound 0.01" if failing
                       else "", checks=checks, accuracy={"tensors": tensors}, env={})


def _plain(i: int, backend: str, verdict: str = "pass", **fields) -> dict:
    case = make_case("columns", {"backend": backend, "dtype": "bf16", "seed": i,
                                 "gpu": ("SIM-A", "SIM-B")[i % 2], "heads_q": 8,
                                 "heads_kv": (8, 2, 1)[i % 3], **fields})
    return {**simulated_record(case, verdict), "id": f"{i:016x}"}


def _records(odd: bool = True) -> list[dict]:
    records = [_plain(i, ("naive", "sdpa")[i % 2]) for i in range(60)]
    records += [_plain(60, "naive", "timed"), _plain(61, "sdpa", "unsupported")]
    records += [_plain(62 + i, "sdpa", "fail", heads_kv=(2, 4)[i % 2])  # sdpa fails on GQA
                for i in range(6)]
    records += [_judged("fail" if h == 2 else "pass", ("dk", "dv") if h == 2 else (),
                        heads_kv=h, seed=s) for h in (4, 2) for s in range(8)]
    records += [_judged("pass", error=2e-3 * 2 ** i, seqlen=n, seed=9)  # a finding
                for i, n in enumerate((512, 1024, 2048, 4096, 8192))]
    no_reason = _plain(70, "naive", "crash")
    del no_reason["reason"]
    null_label = {**_plain(71, "naive", "error"), "label": None}
    records += [no_reason, null_label] if odd else []  # their blocks: read line by line
    records += [_plain(80 + i, "naive") for i in range(60)]
    return records


def _run(tmp_path, records):
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"run_id": "columns"}))
    with open(run / "records.jsonl", "w") as fh:
        for r in records:
            fh.write(json.dumps(r, separators=(",", ":")) + "\n")
    return run


def _show(run, capsys) -> str:
    assert cli.main(["show", str(run)]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("block", [4 << 10, 32 << 10, 4 << 20])
def test_show_from_columns_prints_what_records_print(tmp_path, capsys, monkeypatch, block):
    monkeypatch.setattr(columnar, "BLOCK_BYTES", block)
    run = _run(tmp_path, _records())
    new = _show(run, capsys)
    monkeypatch.setattr(columnar, "pa", None)  # every record one by one, as before
    old = _show(run, capsys)
    assert new == old
    assert "What the failing cases share:" in new and "FINDING" in new  # the text says things
    assert "  crash    0000000000" in new and "  error    0000000000  None: " in new


def test_clean_blocks_are_counted_by_column(tmp_path, monkeypatch):
    # Mutant: every row through RunSummary.add (correct, but the Python cost this removes).
    calls = []
    monkeypatch.setattr(RunSummary, "add", lambda self, r, add=RunSummary.add: (
        calls.append(r["verdict"]), add(self, r))[1])
    monkeypatch.setattr(columnar, "BLOCK_BYTES", 32 << 10)
    records = _records(odd=False)
    run = _run(tmp_path, records)
    summary = RunSummary()
    items = list(last_record_blocks(run / "records.jsonl"))
    assert len(items) > 1 and all(isinstance(item, RecordBlock) for item in items)
    for item in items:
        add_block(summary, item)
    assert summary.count == len(records)
    # only failures and judged records with tensors go one by one
    told = [r for r in records if r["verdict"] == "fail" or r.get("accuracy")]
    assert len(calls) == len(told) < len(records) / 2
