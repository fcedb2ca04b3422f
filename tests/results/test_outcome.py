"""Whether a run ran anything (issue 40, item 1): every case skipped (no connected worker can
run it) is exit 3 with the reason, every case unsupported is exit 1, one case that ran is
enough to be judged as before."""

from __future__ import annotations

import pytest

from attnbench.errors import EXIT_CLUSTER, EXIT_FAILURES
from attnbench.results.outcome import nothing_ran, ran_count

PLAIN = ("cp=1 x tp=1 needs 1 devices on one worker; the largest offers 0 (workers: 1 without "
         "attnbench resources (start workers with `attnbench worker`))")


def test_every_case_skipped_is_the_clusters_fault_with_its_reason():
    idle = nothing_ran({"skipped": 16}, {"skipped": PLAIN})
    assert idle.exit_status == EXIT_CLUSTER
    assert idle.line == ("attnbench: nothing ran: all 16 cases skipped, no connected worker can "
                         f"run them ({PLAIN})")


def test_every_case_unsupported_is_a_failed_run():
    idle = nothing_ran({"unsupported": 3}, {"unsupported": "sdpa: no flash backward on CPU"})
    assert idle.exit_status == EXIT_FAILURES
    assert idle.line == ("attnbench: nothing ran: all 3 cases unsupported by their backend "
                         "(sdpa: no flash backward on CPU)")


def test_skipped_beside_unsupported_is_the_clusters_and_names_both():
    idle = nothing_ran({"skipped": 1, "unsupported": 2}, {})
    assert idle.exit_status == EXIT_CLUSTER
    assert idle.line == ("attnbench: nothing ran: 1 case skipped, no connected worker can run "
                         "it; 2 unsupported by their backend")


def test_no_record_at_all_ran_nothing():
    assert nothing_ran({}).exit_status == EXIT_CLUSTER


@pytest.mark.parametrize("ran", ["pass", "timed", "fail", "crash", "lost"])
def test_one_case_that_started_is_judged_as_before(ran):
    # unsupported beside cases that ran (PyTorch's CPU flash backward) is fine
    assert nothing_ran({"unsupported": 40, "skipped": 3, ran: 1}) is None
    assert ran_count({"unsupported": 40, ran: 2}) == 2


def test_a_hostile_reason_stays_one_bounded_line():
    idle = nothing_ran({"skipped": 2}, {"skipped": "\x1b[2J\nrm -rf /" + "x" * 5000})
    assert "\n" not in idle.line and "\x1b" not in idle.line and len(idle.line) < 500
