"""The embedded cluster's worker starts its rank pools as it starts, before it joins (issue 40,
item 9), so the first case finds them: by the time ``connect`` returns, the worker's plugin
holds one one-rank pool per slot. ``ATTNBENCH_PREWARM=0`` leaves them to the first cases. One
embedded cluster each, ~10 s."""

from __future__ import annotations

import pytest


def _pools() -> int:
    from attnbench.cluster.plugin import worker_state

    return len(worker_state().pools)


@pytest.mark.parametrize("prewarm, expected", [("1", 2), ("0", 0)])
def test_the_embedded_worker_has_its_pools_before_the_first_case(monkeypatch, prewarm, expected):
    from attnbench.cluster.connect import connect

    monkeypatch.setenv("ATTNBENCH_PREWARM", prewarm)
    conn = connect(None, 2)
    try:
        assert conn.client.submit(_pools, pure=False).result(timeout=60) == expected
    finally:
        conn.close()
