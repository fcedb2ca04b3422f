"""A run's journal read once: its frame and the tallies the report's commands share.

``data`` (a run directory: its manifest, its records, one flat row per record), ``reader``
(the frame built in chunks, streamed, with the tallies the pages read), ``pool`` (the same by
several processes, ``--jobs``), ``jobs`` (``--jobs`` parsed and defaulted, results in journal
order), ``canonical`` (one text per value, for keys and tallies), ``environment`` (the
hardware and software a run's records name), ``code_changes`` (each backend's code and the
run options), ``trends`` (error growing with the sequence), ``commonality`` (what the failing
cases share), ``doubt`` (why a timing cannot carry a verdict).
"""

from attnbench import package_face

__all__, __getattr__ = package_face(__name__, {
    "data": ("Run", "flatten", "frame", "load_run"),
    "reader": ("RunReader", "read_run", "run_of_records"),
    "pool": ("read_run_jobs",),
    "jobs": ("JOBS_LIMIT", "default_jobs", "parse_jobs"),
    "code_changes": ("backend_code", "backend_warnings", "options_warnings"),
    "doubt": ("FEW_SAMPLES", "timing_doubt", "why_ambiguous"),
    "environment": ("env_view", "representative", "run_warnings"),
    "commonality": ("Commonality", "case_attention", "value_text"),
    "trends": ("GROWTH_BOUND", "LEVEL_BOUND", "NAIVE_EXCESS", "Point", "SLOPE_BOUND", "Series",
               "findings", "fit"),
})
