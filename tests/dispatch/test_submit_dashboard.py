"""A submitted run ends with a dashboard: the driver (a task of the dispatch package, below the
report package) cannot draw it, so ``attach`` draws it when it sees the driver finish, and
``status`` of a finished run says how. In process, with the drawing stubbed: a second each."""

from attnbench import cli
from attnbench.dispatch.driver_state import write_state
from attnbench.report.commands import write_report
from attnbench.results.records import make_record
from attnbench.results.store import RunStore
from attnbench.sweep.load import parse_sweep

SWEEP = "name: done\naxes: {backend: [naive]}\n"


def _run(tmp_path, state: str):
    """A run whose one case passed (a finished run with no record ran nothing: exit 3,
    tests/end_to_end/test_nothing_ran.py)."""
    run = tmp_path / "run"
    sweep = parse_sweep(SWEEP, "done.yaml")
    store = RunStore(run, sweep, command=["test"])
    store.append(make_record(sweep.cases[0], verdict="pass"))
    store.close()
    write_state(run, {"state": state, "submission": "s1", "written": 1})
    return run


def _attach(run, drawn: list):
    args = cli.build_parser().parse_args(["attach", str(run)])
    assert args.draw is write_report  # the CLI hands report's drawing to attach
    args.draw = lambda run_dir: drawn.append(run_dir) or run_dir / "dashboard" / "index.html"
    return args.func(args)


def test_attach_draws_the_dashboard_when_the_driver_has_finished(tmp_path, capsys):
    # Mutant: attach without the drawing (as before) ends at the driver's line, no dashboard.
    run, drawn = _run(tmp_path, "finished"), []
    assert _attach(run, drawn) == 0 and drawn == [run]
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"attnbench: dashboard {run}/dashboard/index.html"


def test_attach_draws_nothing_for_a_cancelled_run(tmp_path, capsys):
    run, drawn = _run(tmp_path, "cancelled"), []
    assert _attach(run, drawn) == 0 and drawn == []


def test_status_of_a_finished_run_says_how_to_get_the_dashboard(tmp_path, capsys):
    run = _run(tmp_path, "finished")
    assert cli.main(["status", str(run)]) == 0
    assert f"dashboard: attnbench attach {run}" in capsys.readouterr().out


def test_status_of_a_finished_run_with_its_dashboard_names_the_page(tmp_path, capsys):
    """`run` (and attach) drew it already: status names the page instead of a command that
    would draw it again."""
    run = _run(tmp_path, "finished")
    (run / "dashboard").mkdir()
    (run / "dashboard" / "index.html").write_text("<html></html>")
    assert cli.main(["status", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"dashboard: {run}/dashboard/index.html" in out and "attnbench attach" not in out


def test_attach_of_a_finished_run_that_ran_nothing_draws_nothing_and_exits_3(tmp_path, capsys):
    run, drawn = tmp_path / "run", []
    sweep = parse_sweep(SWEEP, "done.yaml")
    store = RunStore(run, sweep, command=["test"])
    store.append(make_record(sweep.cases[0], verdict="skipped", reason="no workers connected"))
    store.close()
    write_state(run, {"state": "finished", "submission": "s1", "written": 1})
    assert _attach(run, drawn) == 3 and drawn == []
    assert capsys.readouterr().out.strip().splitlines()[-1] == (
        "attnbench: nothing ran: 1 case skipped, no connected worker can run it (no workers "
        "connected)")
