"""``submit`` on hostile ground (issue #25, item 3): it says "submitted" only once the driver
runs (a driver that fails as its run loop starts is exit 3 with the driver's reason), and a TLS
cluster with lanes runs every case once (the driver's lanes listener has a certificate). The
lanes themselves against strangers and forgeries: test_hostile_lanes.py.
"""

from __future__ import annotations

import os
import subprocess
import time
from types import SimpleNamespace

from cluster_rig import Processes, certificate, counts_of, write_sweep  # noqa: F401
from helpers import ROOT, SUPPORT, attnbench_cmd


def test_submit_says_submitted_only_once_the_driver_runs(tmp_path, capsys):
    """A driver that fails as its run loop starts: submit exits 3 with the driver's reason,
    never 'submitted' (it printed that, then the driver failed on the lanes' listener)."""
    from attnbench.dispatch import detach
    from attnbench.dispatch.driver_state import write_state

    run_dir = tmp_path / "run"
    run_dir.mkdir()

    class Client:
        def submit(self, func, sweep_text, sweep_path, out, submission, *args, **kw):
            base = {"submission": submission, "worker": "w1", "host": "h", "pid": 1}
            write_state(run_dir, dict(base, state="starting"))

            def fail_soon():
                time.sleep(0.5)
                write_state(run_dir, dict(base, state="failed", message="TypeError: TLS "
                                          "expects a ssl_context"))

            import threading
            threading.Thread(target=fail_soon).start()
            return SimpleNamespace(done=lambda: False, key="k")

    import distributed

    real = distributed.fire_and_forget
    distributed.fire_and_forget = lambda future: None
    try:
        args = SimpleNamespace(retry=None, worker_wait=60.0, dispatch="lanes", start_wait=10.0)
        claim = SimpleNamespace(token="claim", release=lambda: None, hand_over=lambda: None)
        status = detach._hand_over(SimpleNamespace(client=Client()),
                                   SimpleNamespace(source="", path="s.yaml"), run_dir, args,
                                   claim, "s1")
    finally:
        distributed.fire_and_forget = real
    out = capsys.readouterr()
    assert status == 3 and "submitted" not in out.out
    assert "the driver failed: TypeError: TLS expects a ssl_context" in out.err


def test_submit_with_lanes_on_a_tls_cluster(tmp_path, certificate):
    env = dict(os.environ, PYTHONWARNINGS="ignore", SLEEPY_S="0.2")
    env["PYTHONPATH"] = os.pathsep.join([str(SUPPORT), str(ROOT),
                                         env.get("PYTHONPATH", "")])
    env.pop("CUDA_VISIBLE_DEVICES", None)
    cert, key = certificate
    tls = ["--tls-ca-file", str(cert), "--tls-cert", str(cert), "--tls-key", str(key)]
    procs = Processes(tmp_path, env)
    out = tmp_path / "run"
    cases = 6
    try:
        address = procs.scheduler("tls-scheduler", "--protocol", "tls", *tls)
        procs.worker("wT", address, *tls)
        sweep = write_sweep(tmp_path, "tls-submit", {"seed": list(range(cases))}, gpu="any")
        submitted = subprocess.run([*attnbench_cmd(), "submit", str(sweep), "--scheduler",
                                    address, "--out", str(out), *tls], capture_output=True,
                                   text=True, env=env, cwd=ROOT, timeout=180)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        assert "submitted: driver" in submitted.stdout
        attach = subprocess.run([*attnbench_cmd(), "attach", str(out)], capture_output=True,
                                text=True, env=env, cwd=ROOT, timeout=180)
        assert attach.returncode == 0, attach.stdout + attach.stderr
        # The driver's last line, then the dashboard attach draws when the driver finished.
        assert attach.stdout.rstrip().splitlines()[-2:] == [
            "driver: finished", f"attnbench: dashboard {out}/dashboard/index.html"]
        log = procs.started[1].log_path.read_text()
        assert "Traceback" not in log, log[-3000:]
    finally:
        procs.stop_all()
    assert counts_of(cases, out) == {"submitted": cases, "written": cases, "distinct": cases,
                                   "lost": 0, "duplicated": 0}


def test_a_driver_that_ran_and_failed_before_its_state_was_seen_is_not_said_not_to_start(
        tmp_path, capsys):
    """Issue 41 item 9: a driver that recorded 9 cases, then met a full disk (so driver.json
    was never written): the old submit said "the driver did not start". Now it says how far it
    got and that the same submit resumes, exit 3; a driver whose result ran nothing still
    "did not start" (margin: the message keys on cases recorded, not on any result)."""
    from attnbench.dispatch.detach import _wait_for_driver

    def ended(result):
        return SimpleNamespace(done=lambda: True, status="finished", result=lambda: result)

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    full = {"state": "failed", "done": 9, "message": "the run directory: No space left on device"}
    assert _wait_for_driver(ended(full), run_dir, "s1", 1.0) == 3
    err = capsys.readouterr().err
    assert "after recording 9 cases" in err and "did not start" not in err and "resumes" in err
    assert _wait_for_driver(ended({"state": "failed", "message": "no"}), run_dir, "s1", 1.0) == 3
    assert "the driver did not start: no" in capsys.readouterr().err
