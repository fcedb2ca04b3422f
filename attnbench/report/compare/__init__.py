"""``attnbench compare``: the same cases of several runs side by side, and what changed.

``comparison`` (matching cases, timing classes, verdict changes, the text summary),
``formats`` (json and markdown), ``page`` (the comparison dashboard), ``command`` (the
command and :func:`run_compare`).
"""

from attnbench import package_face

__all__, __getattr__ = package_face(__name__, {
    "comparison": ("FAIL_ON", "Comparison", "classify", "compare_runs", "describe",
                   "load_compared", "run_facts", "summary_text"),
    "formats": ("FORMATS", "comparison_markdown", "write_comparison_json"),
    "command": ("add_compare_command", "run_compare"),
})
