"""Dask: where cases run, and the task a worker runs for each.

:mod:`~.connect` connects to an embedded LocalCluster, a running scheduler or SLURM and says
which worker can run which case; :mod:`~.task` is the task a worker runs for one case (devices
leased, the case handed to a warm rank pool, a record always returned); :mod:`~.worker` is
``attnbench worker`` (one Dask worker per node, its devices advertised and leased);
:mod:`~.scheduler_address` finds the scheduler the ways Dask users say it; :mod:`~.simulation`
simulates GPUs for scale tests; :mod:`~.performance_report` keeps Dask's report of a run.
"""
