"""``attnbench gpu-check``: a fresh GPU box's acceptance check, one command, one folder.

:mod:`~.command` (the driver: plan, steps under timeouts, collection; no torch, no Dask),
:mod:`~.plan` and :mod:`~.costs` (steps, estimates, timeouts, Triton variants), :mod:`~.sweeps`
(the check's sweep files, one run directory), :mod:`~.step_runner` / :mod:`~.step_main` (a step
in its own process), the steps :mod:`~.probe`, :mod:`~.prewarm`, :mod:`~.timer_check`,
:mod:`~.run_cases` (speed, accuracy), :mod:`~.smi_log` (clocks and power), :mod:`~.collect`
and :mod:`~.folder` (the result folder's files).
"""

from attnbench import package_face

__all__, __getattr__ = package_face(__name__, {
    "collect": ("collect_folder", "summary_lines"),
    "command": ("add_gpu_check_command", "gpu_visible", "run_check"),
    "costs": ("CPU", "H200", "Machine", "case_seconds"),
    "folder": ("FILES", "MAX_FILES", "folder_files"),
    "plan": ("BUDGET_S", "STEPS", "TARGET_S", "Plan", "Step", "make_plan", "plan_variants"),
    "prewarm": ("compile_parallel", "run_prewarm"),
    "probe": ("run_probe",),
    "run_cases": ("run_accuracy", "run_speed"),
    "smi_log": ("SmiLog",),
    "step_main": ("STEP_FUNCS", "StepConfig"),
    "step_runner": ("StepResult", "run_step"),
    "sweeps": ("CheckSweeps", "load_check_sweeps"),
    "timer_check": ("run_timer",),
})
