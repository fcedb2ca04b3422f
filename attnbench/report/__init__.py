"""Reports of runs: figures (PNG and SVG) and a self-contained HTML dashboard.

- :func:`attnbench.report.commands.write_report` draws one run (``attnbench report RUN``);
  ``attnbench run`` calls it at the end of a run.
- :func:`attnbench.report.commands.run_compare` sets runs side by side (``attnbench compare``).
- Dashboards are declared in ``dashboards/*.yaml`` (:mod:`attnbench.report.dashboard`).

Modules: ``data`` (a record -> a flat row), ``reading`` (a run directory read once, streamed:
the frame in chunks and the tallies the pages read), ``dashboard`` (YAML definitions),
``figures`` (what every figure shares: saving PNG + SVG, axes, legends, a page's colours),
``panels/`` (one module per panel kind, and ``draw_panel``), ``html`` / ``page`` /
``compare_page`` (the pages), ``compare`` (matching and timing classes), ``code_changes``
(each backend's code and the run options, and what differs between runs), ``environment`` (the
hardware and software a run's records name, and what differs between runs), ``style`` (colours
and how verdicts read: "timed" is "not judged"),
``synthetic`` (made-up runs in the real schema, for tests and previews), ``commands`` (argparse
wiring and the functions behind ``attnbench report`` and ``attnbench compare``); for ``show``:
``run_summary`` (counts, failing cases and findings from one pass over a run), ``case_lines``
(``--all``'s line per case) and ``sorted_lines`` (sorting them in bounded memory); for
``export``: ``export`` (the formats), ``export_chunks`` (the table in chunks, each typed as
the whole), ``export_rows`` (CSV and JSON written from the rows, as the frames would print them)
and ``export_pool`` (the same from rows read by several processes: ``--jobs``); for
``report`` and ``compare``: ``read_pool`` (a run read by several processes, ``--jobs``);
``jobs`` (``--jobs`` parsed, for the three).
"""

from attnbench import package_face

__all__, __getattr__ = package_face(__name__, {
    "case_lines": ("label_and_line",),
    "code_changes": ("backend_code", "backend_warnings", "options_warnings"),
    "commands": ("add_report_commands", "run_compare", "write_report"),
    "compare": ("classify", "compare_runs", "describe", "run_facts"),
    "dashboard": ("PANEL_KINDS", "default_dashboard", "load_dashboard"),
    "data": ("Run", "flatten", "frame", "load_run"),
    "doubt": ("FEW_SAMPLES", "timing_doubt", "why_ambiguous"),
    "environment": ("env_view", "representative", "run_warnings"),
    "export": ("add_export_command",),
    "figures": ("Context", "slug"),
    "html": ("sort_key",),
    "interactive": ("PAGE", "script_json"),
    "page": ("render",),
    "jobs": ("JOBS_LIMIT", "parse_jobs"),
    "read_pool": ("read_run_jobs",),
    "reading": ("RunReader", "read_run", "run_of_records"),
    "run_summary": ("RunSummary",),
    "sorted_lines": ("SortedLines",),
    "synthetic": ("write_synthetic_run",),
    "trends": ("GROWTH_BOUND", "Point", "SLOPE_BOUND", "Series", "findings", "fit"),
})
