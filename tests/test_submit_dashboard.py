"""A submitted run ends with a dashboard: the driver (a task of the dispatch package, below the
report package) cannot draw it, so ``attach`` draws it when it sees the driver finish, and
``status`` of a finished run says how."""

import subprocess

from attnbench.dispatch.driver_state import write_state
from attnbench.report.synthetic import write_synthetic_run
from helpers import attnbench_cmd


def _finished_run(tmp_path):
    run = tmp_path / "run"
    write_synthetic_run(run, size="small")
    write_state(run, {"state": "finished", "submission": "s1", "written": 3})
    return run


def test_attach_draws_the_dashboard_when_the_driver_has_finished(tmp_path):
    # Mutant: attach without the drawing (as before) ends at the driver's line, no dashboard.
    run = _finished_run(tmp_path)
    proc = subprocess.run([*attnbench_cmd(), "attach", str(run)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last == f"attnbench: dashboard {run}/dashboard/index.html"
    assert (run / "dashboard" / "index.html").is_file()


def test_status_of_a_finished_run_says_how_to_get_the_dashboard(tmp_path):
    run = _finished_run(tmp_path)
    proc = subprocess.run([*attnbench_cmd(), "status", str(run)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"dashboard: attnbench attach {run}" in proc.stdout
