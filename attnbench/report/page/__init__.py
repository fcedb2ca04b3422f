"""``attnbench report``: a run's dashboard, its panels and its self-contained HTML pages.

``command`` (the command and :func:`write_report`), ``dashboard`` (YAML definitions: which
panels, in which order), ``build`` (draw the panels, write ``index.html``), ``panels/`` (one
module per panel kind), ``figures`` (what every figure shares), ``html`` (the pages' HTML,
escaped), ``interactive`` (``interactive.html``), ``style`` (colours, how verdicts read).
"""

from attnbench import package_face

__all__, __getattr__ = package_face(__name__, {
    "command": ("REPORT_DIR", "add_report_command", "resolve_dashboard", "write_report"),
    "build": ("build_report", "render"),
    "dashboard": ("PANEL_KINDS", "default_dashboard", "load_dashboard"),
    "figures": ("Context", "slug"),
    "html": ("sort_key",),
    "interactive": ("PAGE", "script_json"),
})
