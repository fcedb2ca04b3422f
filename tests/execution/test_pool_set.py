"""A worker's rank pools started before its first case (issue 40, item 9: the smoke run's first
record waited for a rank's start, 5 s under load): :meth:`PoolSet.prewarm` starts a pool that
the next lease of its shape gets warm, and a lease taken while it starts waits for that start
instead of starting a second pool. Real rank processes, no torch; a few seconds."""

from __future__ import annotations

import threading

from attnbench.execution.pool_set import PoolSet

T = "attnbench.execution.testing:"


def test_a_prewarmed_pool_is_the_next_lease_and_already_up():
    pools = PoolSet()
    try:
        assert pools.prewarm() is None and len(pools) == 1
        with pools.lease(world_size=1) as pool:
            outcome = pool.run(T + "echo", 1, timeout=30)
        assert outcome.kind == "ok" and outcome.start_s == 0  # no rank started for the case
        assert len(pools) == 1
    finally:
        pools.close()


def test_a_lease_during_the_start_waits_for_it_rather_than_starting_another():
    pools = PoolSet()
    try:
        warming = threading.Thread(target=pools.prewarm, args=([None, None],))
        warming.start()
        while len(pools) < 2:  # both are listed (and free) before the first starts
            pass
        with pools.lease(world_size=1) as one, pools.lease(world_size=1) as two:
            outcomes = [p.run(T + "echo", 2, timeout=60) for p in (one, two)]
        warming.join(timeout=60)
        # Two pools, the prewarmed ones: one the thread started (or the lease, waiting for
        # its lock), the other started by its lease or the thread, never a third.
        assert [o.kind for o in outcomes] == ["ok", "ok"] and len(pools) == 2
    finally:
        pools.close()
    assert pools.prewarm() is None and len(pools) == 0  # closed: nothing started
