"""Warm rank pools shared by the threads of one process (:class:`PoolSet`: a Dask worker's
task threads lease them), and this process's default set (:func:`get_default_poolset`). The
pools themselves are :class:`attnbench.execution.pool.RankPool`.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from typing import Any, Iterator, Mapping, Optional, Sequence

from attnbench.execution.pool import EnvSpec, RankPool
from attnbench.execution.ranks import Outcome


def _freeze_env(env: EnvSpec) -> Any:
    if env is None:
        return None
    if isinstance(env, Mapping):
        return tuple(sorted((str(k), str(v)) for k, v in env.items()))
    return tuple(_freeze_env(e) for e in env)


class PoolSet:
    """Warm pools shared by the threads of one process (a Dask worker's task threads).

    ``lease`` hands out a free pool of the wanted shape, creating one when none is free, and
    takes it back afterwards. Pools are keyed by ``world_size`` and ``env`` (a pool whose ranks
    are bound to some GPUs through ``CUDA_VISIBLE_DEVICES`` serves only leases of those GPUs).
    """

    def __init__(self, threads_per_pool: Optional[int] = None, *, preload: Sequence[str] = (),
                 start_timeout: float = 120.0):
        self.threads_per_pool = threads_per_pool
        self.preload = tuple(preload)
        self.start_timeout = start_timeout
        self._lock = threading.Lock()
        self._free: dict[Any, list[RankPool]] = {}
        self._all: list[RankPool] = []
        self._closed = False

    @contextlib.contextmanager
    def lease(self, world_size: int = 1, env: EnvSpec = None) -> Iterator[RankPool]:
        key = (world_size, _freeze_env(env))
        with self._lock:
            if self._closed:
                raise RuntimeError("this PoolSet is closed")
            free = self._free.get(key)
            pool = free.pop() if free else None
            if pool is None:
                pool = RankPool(world_size, env, self.threads_per_pool, preload=self.preload,
                                start_timeout=self.start_timeout)
                self._all.append(pool)
        try:
            yield pool
        finally:
            with self._lock:
                if self._closed or pool._closed:
                    pool.close()
                    if pool in self._all:
                        self._all.remove(pool)
                else:
                    self._free.setdefault(key, []).append(pool)

    def prewarm(self, envs: Sequence[EnvSpec] = (None,),
                world_size: int = 1) -> Optional[Outcome]:
        """A pool of ``world_size`` per ``envs`` entry, all free for leases at once, then
        started one after another (the worker's first cases find their ranks up). A lease that
        takes one meanwhile starts it itself, or waits on the pool's own lock for the start
        under way: never a second pool. None when they started (or this set is closed), else
        the first failure (the rest are left to their leases, which retry)."""
        pools = []
        with self._lock:
            if self._closed:
                return None
            for env in envs:
                pool = RankPool(world_size, env, self.threads_per_pool, preload=self.preload,
                                start_timeout=self.start_timeout)
                pools.append(pool)
                self._all.append(pool)
                self._free.setdefault((world_size, _freeze_env(env)), []).append(pool)
        for pool in pools:
            try:
                failed = pool.start()
            except RuntimeError:  # closed under it (the worker closing): nothing to warm
                return None
            if failed is not None:
                return failed
        return None

    def close_idle(self) -> int:
        """Close every pool that is not leased (frees their processes and GPU memory)."""
        with self._lock:
            idle = [p for pools in self._free.values() for p in pools]
            self._free.clear()
            self._all = [p for p in self._all if p not in idle]
        for pool in idle:
            pool.close()
        return len(idle)

    def close(self) -> None:
        """Close every pool, leased ones included (their calls end as crashes)."""
        with self._lock:
            self._closed = True
            pools, self._all = self._all, []
            self._free.clear()
        for pool in pools:
            pool.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return len(self._all)


_default: Optional[PoolSet] = None
_default_lock = threading.Lock()


def get_default_poolset() -> PoolSet:
    """This process's PoolSet, created on first use and closed at interpreter exit (outside a
    Dask worker: a worker's pools are its plugin's). Set its ``threads_per_pool`` before the
    first lease to give ranks a torch thread count."""
    global _default
    with _default_lock:
        if _default is None or _default._closed:
            _default = PoolSet()
            atexit.register(_default.close)
        return _default
