"""Reports of runs: figures (PNG and SVG) and a self-contained HTML dashboard.

- :func:`attnbench.report.commands.write_report` draws one run (``attnbench report RUN``);
  ``attnbench run`` calls it at the end of a run.
- :func:`attnbench.report.compare.run_compare` sets runs side by side (``attnbench compare``).
- Dashboards are declared in ``dashboards/*.yaml`` (:mod:`attnbench.report.dashboard`).

Modules: ``data`` (run directory -> pandas frame), ``dashboard`` (YAML definitions),
``panels`` (one function per panel kind), ``html`` / ``page`` / ``compare_page`` (the pages),
``compare`` (matching and timing classes), ``style`` (colours), ``synthetic`` (made-up runs in
the real schema, for tests and previews), ``commands`` (argparse wiring).
"""
