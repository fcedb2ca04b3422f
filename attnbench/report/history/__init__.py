"""``attnbench history``: each case's time and error over many runs, and the steps in them.

``collect`` (run directories, or folders of them, read as compare reads them), ``order``
(commit date, else run start), ``steps`` (the step rule), ``series`` (per GPU kind, a case's
values per run and its steps), ``table`` (text and JSON), ``page`` (the HTML page),
``command`` (the command and :func:`run_history`).
"""

from attnbench import package_face

__all__, __getattr__ = package_face(__name__, {
    "collect": ("HistoryRun", "load_history", "run_dirs"),
    "order": ("ORDERS", "order_runs"),
    "steps": ("MIN_SIDE", "Step", "find_steps", "is_step"),
    "series": ("METRICS", "CaseHistory", "FoundStep", "GpuHistory", "build_histories"),
    "table": ("history_json", "history_text"),
    "page": ("build_history_page",),
    "command": ("add_history_command", "run_history"),
})
