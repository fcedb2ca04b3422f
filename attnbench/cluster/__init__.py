"""Dask: where cases run, and the task a worker runs for each.

:mod:`~.connect` connects to an embedded LocalCluster, a running scheduler or SLURM and says
which worker can run which case; :mod:`~.task` is the task a worker runs for one case (devices
leased, the case handed to a warm rank pool, a record always returned); :mod:`~.worker` is
``attnbench worker`` (one Dask worker per node, its devices advertised and leased);
:mod:`~.scheduler_address` finds the scheduler the ways Dask users say it; :mod:`~.simulation`
simulates GPUs for scale tests; :mod:`~.performance_report` keeps Dask's report of a run;
:mod:`~.keeper` brings the embedded cluster's worker back when it leaves; :mod:`~.closed_http`
closes the HTTP port Dask opens despite ``--no-dashboard``.
"""

from attnbench import package_face

__all__, __getattr__ = package_face(__name__, {
    "closed_http": ("ROUTES_ENV",),
    "connect": ("Connection", "WorkerInfo", "check_connection_arguments", "describe_workers",
                "make_security", "plan_case"),
    "early": ("EarlyConnection",),
    "keeper": ("RESTARTS", "START_S", "WorkerKeeper"),
    "performance_report": ("REPORT_NAME", "saved_performance_report"),
    "plugin": ("CASE_RUNNER", "NAME", "WorkerState", "register", "worker_state"),
    "scheduler_address": ("check_choice", "choose_scheduler", "read_scheduler_file"),
    "simulation": ("lease_overlaps", "simulate_case", "simulated_seconds"),
    "task": ("CASE_FUNC", "COMPILE_TOPIC", "CPU_RANKS_PER_SLOT", "compile_teller",
             "outcome_to_record", "run_case_task", "run_case_task_text"),
    "worker": ("DetectionError", "DeviceLeases", "LeaseTimeout", "detect_gpus", "detect_node",
               "worker_main"),
})
