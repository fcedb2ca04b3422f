"""Running cases outside the Dask worker's own process.

:mod:`attnbench.execution.pool` keeps warm rank processes (:class:`RankPool`, :class:`PoolSet`)
and turns their crashes, hangs and out-of-memory errors into :class:`Outcome` values;
:mod:`attnbench.execution.child` is the rank process itself. Importing this package imports
neither torch nor the case runner.
"""

from attnbench.execution.ranks import Outcome
from attnbench.execution.pool import PoolSet, RankPool, get_default_poolset

__all__ = ["Outcome", "PoolSet", "RankPool", "get_default_poolset"]
