"""Running cases outside the Dask worker's own process.

:mod:`attnbench.execution.pool` keeps warm rank processes (:class:`RankPool`; shared by a
process's threads: :mod:`~.pool_set`'s :class:`PoolSet`)
and turns their crashes, hangs and out-of-memory errors into :class:`Outcome` values;
:mod:`attnbench.execution.child` is the rank process itself. Importing this package imports
neither torch nor the case runner.
"""

from attnbench import package_face

__all__, __getattr__ = package_face(__name__, {
    "case_runner": ("run_case", "run_payload", "served_kinds"),
    "child": ("read_message", "write_message"),
    "multi": ("run_parallel_case",),
    "pool": ("RankPool",),
    "pool_set": ("PoolSet", "get_default_poolset"),
    "ranks": ("OUTCOME_KINDS", "FrameReader", "Outcome"),
    "single": ("run_single_case",),
})
