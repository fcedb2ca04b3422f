"""A CPU rank runs one torch thread whatever the node's slots, on the embedded cluster and under
``attnbench worker`` alike (issue 27: ``attnbench worker --slots 1`` gave its ranks 2 threads,
the embedded cluster's default 1; 2 threads cost a busy box 15x a forward's CPU time)."""

import pytest

from attnbench.cluster import worker
from attnbench.resources import ENV_THREADS


@pytest.mark.parametrize("slots", [None, 1, 2, 8])
def test_cpu_ranks_get_one_thread_whatever_the_slots(monkeypatch, slots):
    # Mutant: threads = cores // slots (the rule before) gives 8 threads to --slots 1 here.
    monkeypatch.setattr(worker.os, "cpu_count", lambda: 8)
    monkeypatch.delenv(ENV_THREADS, raising=False)
    node = worker.detect_node(slots=slots, gpus=[])
    assert node.threads == 1 and node.environ()[ENV_THREADS] == "1"
    assert "1 thread per rank" in node.describe()


def test_the_users_choice_wins(monkeypatch):
    monkeypatch.setenv(ENV_THREADS, "3")
    assert worker.detect_node(slots=1, gpus=[]).threads == 3
