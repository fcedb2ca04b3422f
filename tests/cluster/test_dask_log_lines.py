"""Which of Dask's log lines reach the terminal (``attnbench.cli.shown_log_record``).

Seen in CI under load: the embedded worker SIGKILLed while LocalCluster closed its nanny
(tests/cluster/test_embedded_worker.py, lost-worker-timeout 0 s), the nanny's restart task was
cancelled and Dask's ``log_errors`` printed "distributed.nanny: " and a traceback, though the
run went on and said so in one line. Here the call that decorator makes is made directly.
Mutant: without the CancelledError clause the first test fails.
"""

from __future__ import annotations

import asyncio
import io
import logging

import pytest
import distributed  # noqa: F401  (its logging set up, as in a run)

from attnbench.cli import shown_log_record


@pytest.fixture
def terminal():
    """The root handler as ``attnbench`` sets it up: its filter, its format."""
    text = io.StringIO()
    handler = logging.StreamHandler(text)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    handler.addFilter(shown_log_record)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield text
    finally:
        root.removeHandler(handler)


def _logged_by_log_errors(exc: BaseException) -> None:
    """What ``distributed.utils.log_errors`` does with an exception out of a nanny's
    coroutine: ``logging.getLogger(<its module>).exception(exc)``."""
    try:
        raise exc
    except BaseException as caught:
        logging.getLogger("distributed.nanny").exception(caught)


def test_a_cancelled_dask_task_prints_nothing(terminal):
    _logged_by_log_errors(asyncio.CancelledError())
    assert terminal.getvalue() == ""


def test_dask_errors_still_print_with_their_traceback(terminal):
    _logged_by_log_errors(ValueError("the scheduler refused"))
    assert "the scheduler refused" in terminal.getvalue()
    assert "Traceback" in terminal.getvalue()


@pytest.mark.parametrize("name, level, shown", [
    ("distributed.scheduler", logging.INFO, False),
    ("distributed.nanny", logging.WARNING, False),
    ("tornado.application", logging.ERROR, True),
    ("attnbench", logging.INFO, True),
    ("attnbench", logging.WARNING, True),
])
def test_levels_by_logger(name, level, shown):
    record = logging.LogRecord(name, level, __file__, 1, "a line", None, None)
    assert shown_log_record(record) is shown


def test_our_own_cancelled_errors_are_shown():
    """Only Dask's, Bokeh's and Tornado's cancelled tasks are taken for noise."""
    try:
        raise asyncio.CancelledError()
    except asyncio.CancelledError as exc:
        record = logging.LogRecord("attnbench", logging.ERROR, __file__, 1, "x", None,
                                   (type(exc), exc, exc.__traceback__))
    assert shown_log_record(record)
