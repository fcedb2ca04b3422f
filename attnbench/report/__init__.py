"""Reports of runs: figures (PNG and SVG) and a self-contained HTML dashboard.

One room per command, above what they share (lowest first; a room imports only rooms before
it, checked by tests/project/test_structure.py):

- ``read/``: a run's journal read once, into a frame and the tallies every command shares
  (the hardware and software it ran on, each backend's code, error trends, timing doubt), by
  one process or several (``--jobs``);
- ``show/``: ``attnbench show`` (counts, failing cases, findings; ``--all``'s line per case);
- ``export/``: ``attnbench export`` (csv, json, parquet; in chunks, by several processes);
- ``page/``: ``attnbench report``: the dashboard's definitions, its panels, its HTML pages;
- ``compare/``: ``attnbench compare``: matching, timing classes, text/json/markdown, its page.

``commands`` puts ``report`` and ``compare`` on the CLI; ``synthetic`` makes up runs in the
real schema (tests and previews). The modules' old names (``attnbench.report.read.data``, ...)
still import, with a DeprecationWarning naming the new one.
"""

from attnbench import moved_modules, package_face

__all__, __getattr__ = package_face(__name__, {
    "show.case_lines": ("label_and_line",),
    "read.code_changes": ("backend_code", "backend_warnings", "options_warnings"),
    "commands": ("add_report_commands",),
    "page.command": ("write_report",),
    "compare.command": ("run_compare",),
    "compare.comparison": ("compare_runs", "describe", "run_facts"),
    "compare.gate": ("classify",),
    "page.dashboard": ("PANEL_KINDS", "default_dashboard", "load_dashboard"),
    "read.data": ("Run", "flatten", "frame", "load_run"),
    "read.doubt": ("FEW_SAMPLES", "timing_doubt", "why_ambiguous"),
    "read.environment": ("env_view", "representative", "run_warnings"),
    "export.command": ("add_export_command",),
    "page.figures": ("Context", "slug"),
    "page.html": ("sort_key",),
    "page.interactive": ("PAGE", "script_json"),
    "page.build": ("render",),
    "read.jobs": ("JOBS_LIMIT", "parse_jobs"),
    "read.pool": ("read_run_jobs",),
    "read.reader": ("RunReader", "read_run", "run_of_records"),
    "show.summary": ("RunSummary",),
    "show.sorted_lines": ("SortedLines",),
    "synthetic": ("write_synthetic_run",),
    "read.trends": ("GROWTH_BOUND", "Point", "SLOPE_BOUND", "Series", "findings", "fit"),
})

MOVED = {
    "data": "read.data", "reading": "read.reader", "read_pool": "read.pool", "jobs": "read.jobs",
    "canonical": "read.canonical", "environment": "read.environment",
    "code_changes": "read.code_changes", "trends": "read.trends", "doubt": "read.doubt",
    "run_summary": "show.summary", "case_lines": "show.case_lines",
    "sorted_lines": "show.sorted_lines",
    "export_chunks": "export.chunks", "export_rows": "export.rows", "export_pool": "export.pool",
    "html": "page.html", "interactive": "page.interactive", "dashboard": "page.dashboard",
    "figures": "page.figures", "style": "page.style", "panels": "page.panels",
    "compare_formats": "compare.formats", "compare_page": "compare.page",
}
"""Old module -> its new home (issue 38, 2026-12). ``export``, ``compare`` and ``page`` kept
their names as packages, whose faces give the old modules' public names."""
moved_modules(__name__, MOVED)
