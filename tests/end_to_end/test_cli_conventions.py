"""The conventions of the ecosystem's tools: ``--version``, ``python -m attnbench``, exit codes in
``--help``, a quiet end when the reader of standard output leaves (``| head``), the Dask ways of
naming a scheduler (``DASK_SCHEDULER_ADDRESS``, dask config, ``--scheduler-file``), and a Dask
performance report beside every run's records. (Runs against a real scheduler through these:
tests/cluster/test_multinode.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata

import pytest

from attnbench.cluster.scheduler_address import choose_scheduler, read_scheduler_file
from attnbench.errors import EXIT_BROKEN_PIPE, UsageError
from helpers import ROOT


def _attnbench(*argv: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnbench", *argv], capture_output=True,
                          text=True, cwd=ROOT, timeout=300, env=env, **kw)


def test_version_and_python_dash_m():
    proc = _attnbench("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"attnbench {metadata.version('attnbench')}"


def test_help_lists_every_exit_status():
    from attnbench import errors

    out = _attnbench("--help").stdout
    for status in (errors.EXIT_OK, errors.EXIT_FAILURES, errors.EXIT_BAD_INPUT,
                   errors.EXIT_CLUSTER, errors.EXIT_FINDINGS, errors.EXIT_INTERRUPTED,
                   errors.EXIT_BROKEN_PIPE):
        assert f"\n  {status} " in out, f"exit status {status} missing from --help"


@pytest.mark.parametrize("argv", [["show", "{run}", "--all"], ["export", "{run}"],
                                  ["compare", "{run}", "{run}/../copy", "--no-dashboard"],
                                  ["--help"]])
def test_a_reader_that_leaves_early_ends_the_command_quietly(argv, tiny, tmp_path):
    """`attnbench show RUN | head`: no BrokenPipeError traceback, exit 141 like `yes | head`.
    The reader closes its end before the command writes anything, so every write fails."""
    import shutil

    copy = tiny.parent / "copy"
    if not copy.exists():
        shutil.copytree(tiny, copy, ignore=shutil.ignore_patterns("dashboard", ".lock"))
    argv = [a.format(run=tiny) for a in argv]
    proc = subprocess.Popen([sys.executable, "-m", "attnbench", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT)
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    # (argparse swallows the error of printing --help: it ends with 0)
    expected = (0, EXIT_BROKEN_PIPE) if argv == ["--help"] else (EXIT_BROKEN_PIPE,)
    assert proc.wait(timeout=300) in expected, stderr
    assert stderr == ""


def test_every_run_saves_a_dask_performance_report_beside_its_records(tiny):
    report = tiny / "dask-performance.html"
    assert report.is_file()
    head = report.read_text()[:20000]
    assert "<html" in head.lower() and "Dask Performance Report" in head


# -- which scheduler --------------------------------------------------------------------------


def test_the_scheduler_comes_from_options_then_dask_config(monkeypatch, tmp_path):
    import dask

    assert choose_scheduler("tcp://a:1", None, None, 0).address == "tcp://a:1"
    assert choose_scheduler(None, None, "local", 0).address is None
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    with dask.config.set({"scheduler-address": None}):
        assert choose_scheduler(None, None, None, 0).address is None  # the embedded cluster
    with dask.config.set({"scheduler-address": "tcp://from-config:8786"}):
        choice = choose_scheduler(None, None, None, 0)
        assert (choice.address, choice.source) == ("tcp://from-config:8786",
                                                   "dask config scheduler-address")
        assert choose_scheduler("tcp://given:1", None, None, 0).address == "tcp://given:1"
        assert choose_scheduler(None, None, "local", 0).address is None
    info = tmp_path / "scheduler.json"
    info.write_text(json.dumps({"type": "Scheduler", "address": "tcp://10.0.0.1:8786"}))
    choice = choose_scheduler(None, str(info), None, 0)
    assert choice.address == "tcp://10.0.0.1:8786" and choice.source.startswith("--scheduler-file")
    with pytest.raises(UsageError, match="give one of --scheduler, --scheduler-file and "
                                         "--cluster, not --scheduler and --scheduler-file"):
        choose_scheduler("tcp://a:1", str(info), None, 0)


def test_dask_scheduler_address_reaches_attnbench_run(tmp_path):
    """The variable Dask's own Client reads is honoured by `attnbench run`; a bad value is one
    line naming the variable, exit 2, and no run directory."""
    env = dict(os.environ, DASK_SCHEDULER_ADDRESS="ftp://head:8786", PYTHONWARNINGS="ignore")
    out = tmp_path / "run"
    proc = _attnbench("run", "tests/support/data/tiny.yaml", "--out", str(out), env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "attnbench: error: DASK_SCHEDULER_ADDRESS: got 'ftp://head:8786', expected a Dask "
        "scheduler address such as tcp://host:8786 or tls://host:8786"]
    assert not out.exists()


@pytest.mark.parametrize("content, message", [
    (None, "no such scheduler file (waited 0 s, --worker-wait)"),
    ("{not json", "got text that is not JSON"),
    ('{"type": "Scheduler"}', "address: got None, expected the scheduler's address"),
    ('[1, 2]', "address: got None"),
])
def test_a_bad_scheduler_file_is_one_line(tmp_path, content, message):
    info = tmp_path / "scheduler.json"
    if content is not None:
        info.write_text(content)
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_scheduler_file(info, 0)
    proc = _attnbench("run", "tests/support/data/tiny.yaml", "--out", str(tmp_path / "run"),
                      "--scheduler-file", str(info), "--worker-wait", "0")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert str(info) in proc.stderr and not (tmp_path / "run").exists()


def test_a_scheduler_file_written_late_is_waited_for(tmp_path):
    import threading

    info = tmp_path / "scheduler.json"
    timer = threading.Timer(0.5, lambda: info.write_text('{"address": "tcp://127.0.0.1:1"}'))
    timer.start()
    try:
        assert read_scheduler_file(info, 30) == "tcp://127.0.0.1:1"
    finally:
        timer.cancel()


def test_the_performance_report_shows_the_command_as_text(tmp_path, monkeypatch):
    """Dask writes the calling code into its page unescaped: a sweep named "<script>.yaml"
    must reach it escaped."""
    import asyncio

    import distributed

    seen = {}

    class FakeReport:
        def __init__(self, filename):
            seen["filename"] = filename

        async def __aenter__(self):
            pass

        async def __aexit__(self, *exc, code=None):
            seen["code"] = code

    class FakeClient:
        def sync(self, fn, *args, **kwargs):
            return asyncio.run(fn(*args, **kwargs))

    monkeypatch.setattr(distributed, "performance_report", FakeReport)
    from attnbench.cluster.performance_report import REPORT_NAME, saved_performance_report

    with saved_performance_report(tmp_path, FakeClient(), "attnbench run <script>x</script>.yaml"):
        pass
    assert seen == {"filename": str(tmp_path / REPORT_NAME),
                    "code": "attnbench run &lt;script&gt;x&lt;/script&gt;.yaml"}
    seen.clear()
    with pytest.raises(RuntimeError), saved_performance_report(tmp_path, FakeClient(), "x"):
        raise RuntimeError("scheduler lost")  # no report asked of a scheduler that is gone
    assert "code" not in seen
