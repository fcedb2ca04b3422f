"""The order of a history's runs (attnbench.report.history.order): commit date, runs of one
commit by start; else start; else as given; and the dates as records and manifests hold them."""

from pathlib import Path

from attnbench.report.history.collect import HistoryRun, history_run, parse_time
from attnbench.report.history.order import ORDERS, order_runs
from attnbench.report.read.data import Run
from attnbench.report.read.environment import Environment


def _run(name, commit_date=None, created=None) -> HistoryRun:
    return HistoryRun(run=None, commit=name, commit_date=parse_time(commit_date),
                      created=parse_time(created))


def test_commit_date_then_start_for_runs_of_one_commit():
    runs = [_run("b2", "2026-12-02T00:00:00Z", "2026-12-09T00:00:00Z"),
            _run("a", "2026-12-01T00:00:00+02:00", "2026-12-10T00:00:00Z"),
            _run("b1", "2026-12-02T00:00:00Z", "2026-12-08T00:00:00Z")]
    ordered, order = order_runs(runs)
    assert order == ORDERS[0] == "commit date"
    assert [r.commit for r in ordered] == ["a", "b1", "b2"]


def test_one_run_without_a_commit_date_orders_all_by_start():
    runs = [_run("x", "2026-12-02T00:00:00Z", "2026-12-09T00:00:00Z"),
            _run("y", None, "2026-12-01T00:00:00Z")]
    ordered, order = order_runs(runs)
    assert order == "run start" and [r.commit for r in ordered] == ["y", "x"]
    ordered, order = order_runs([*runs, _run("z")])
    assert order == "as given" and [r.commit for r in ordered] == ["x", "y", "z"]


def test_times_are_read_as_iso_8601_or_not_at_all():
    assert parse_time("2026-12-01T10:00:00Z") == parse_time("2026-12-01T12:00:00+02:00")
    assert parse_time("2026-12-01T10:00:00").tzinfo is not None  # no zone: UTC
    for bad in (None, 3, "", "yesterday", "9" * 100, ["2026-12-01"]):
        assert parse_time(bad) is None


def test_the_records_commit_and_date_before_the_manifests():
    """The records' own environment produced the numbers; the manifest is the client's."""
    manifest = {"created": "2026-12-05T00:00:00Z",
                "versions": {"commit": "c" * 40, "commit_date": "2026-12-03T00:00:00Z"}}
    run = Run(path=Path("r"), manifest=manifest, frame=None,
              environments=[Environment({"commit": "d" * 40, "commit_date": "2026-12-04T00:00:00Z",
                                 "dirty": True}, records=1)])
    facts = history_run(run)
    assert facts.commit == "d" * 40 and facts.dirty is True
    assert facts.commit_date == parse_time("2026-12-04T00:00:00Z")
    assert facts.created == parse_time("2026-12-05T00:00:00Z")
    facts = history_run(Run(path=Path("r"), manifest=manifest, frame=None))
    assert facts.commit == "c" * 40 and facts.commit_date == parse_time("2026-12-03T00:00:00Z")
