"""``attnbench compare``: the same cases of several runs side by side, and what changed.

``comparison`` (matching cases, verdict changes, the text summary), ``gate`` (the timing
classes: SLOW, FAST, SAME, AMBIGUOUS),
``formats`` (json and markdown), ``page`` (the comparison dashboard), ``command`` (the
command and :func:`run_compare`).
"""

from attnbench import package_face

__all__, __getattr__ = package_face(__name__, {
    "comparison": ("FAIL_ON", "Comparison", "compare_runs", "describe", "load_compared",
                   "run_facts", "summary_text"),
    "gate": ("bound", "classify", "float_column", "few_samples", "timing_columns"),
    "formats": ("FORMATS", "comparison_markdown", "write_comparison_json"),
    "command": ("add_compare_command", "run_compare"),
})
