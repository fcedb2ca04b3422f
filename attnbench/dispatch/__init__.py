"""Handing a sweep's cases out and journaling what comes back.

:mod:`~.run` submits one Dask task per case; :mod:`~.lanes` runs one long task per device that
pulls cases from the driver; :mod:`~.driver` is the driver as a Dask task (``attnbench
submit``), :mod:`~.driver_state` what a detached run leaves for ``status``, ``attach`` and
``cancel``, and :mod:`~.detach` those commands; :mod:`~.eta` the progress line's ETA, from
measured case times per backend and GPU kind.
"""

from attnbench import package_face

__all__, __getattr__ = package_face(__name__, {
    "detach": ("add_detach_commands", "journal_outcome", "journal_verdicts",
               "no_worker_runs_any"),
    "driver": ("drive", "local_run_status"),
    "eta": ("CaseTimes", "time_key"),
    "lanes": ("LaneRun", "make_run", "run_class"),
    "loop": ("Progress", "RunLoop"),
    "preflight": ("check_workers_import",),
    "run": ("SweepRun", "run_pending"),
}, moved={"DISPATCHES": "attnbench.resources"})
