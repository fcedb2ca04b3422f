"""What a run leaves: records, their schema, the journal and its lock.

:mod:`~.records` (one record per case, and the verdicts), :mod:`~.schema` (every record and
manifest checked when read: run directories travel between people), :mod:`~.store` (the run
directory: ``manifest.json`` and ``records.jsonl``, appended and flushed as records arrive) and
:mod:`~.lock` (one writer per run directory, also across hosts).
"""
