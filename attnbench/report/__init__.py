"""Reports of runs: figures (PNG and SVG) and a self-contained HTML dashboard.

- :func:`attnbench.report.commands.write_report` draws one run (``attnbench report RUN``);
  ``attnbench run`` calls it at the end of a run.
- :func:`attnbench.report.commands.run_compare` sets runs side by side (``attnbench compare``).
- Dashboards are declared in ``dashboards/*.yaml`` (:mod:`attnbench.report.dashboard`).

Modules: ``data`` (run directory -> pandas frame), ``dashboard`` (YAML definitions),
``figures`` (what every figure shares: saving PNG + SVG, axes, legends, a page's colours),
``panels/`` (one module per panel kind, and ``draw_panel``), ``html`` / ``page`` /
``compare_page`` (the pages), ``compare`` (matching and timing classes), ``environment`` (the
hardware and software a run's records name, and what differs between runs), ``style`` (colours
and how verdicts read: "timed" is "not judged"),
``synthetic`` (made-up runs in the real schema, for tests and previews), ``commands`` (argparse
wiring and the functions behind ``attnbench report`` and ``attnbench compare``).
"""
