"""What a run leaves: records, their schema, the journal and its lock.

:mod:`~.records` (one record per case, and the verdicts), :mod:`~.schema` (every record and
manifest checked when read: run directories travel between people), :mod:`~.store` (the run
directory: ``manifest.json`` and ``records.jsonl``, appended and flushed as records arrive) and
:mod:`~.lock` (one writer per run directory, also across hosts), :mod:`~.outcome` (whether a
run ran anything: one where every case was refused is not a success); :mod:`~.journal` (the one
journal reader: streamed, each line capped), :mod:`~.columnar` (its clean blocks as Arrow
columns, where that reads the same), :mod:`~.ledger` (what a run keeps of each recorded
case: verdict and attempt, never the record) and :mod:`~.files` (every file written in a run
directory: a new temporary file, then a rename; no link followed).
"""

from attnbench import package_face

__all__, __getattr__ = package_face(__name__, {
    "files": ("create_temp", "open_append", "open_update", "refusal", "write_atomic"),
    "journal": ("JournalLine", "MAX_FIELD_CHARS", "MAX_LINE_BYTES", "fit_line", "journal_lines",
                "journal_records", "read_lines"),
    "ledger": ("Entry", "LineRange", "SecondPass", "last_records", "line_ranges",
               "range_records", "read_ledger"),
    "lock": ("Cancelled", "LOCK", "RunLock", "describe_holder"),
    "records": ("BAD_VERDICTS", "CHECKS", "DIED_VERDICTS", "IDENTITIES", "JUDGED_VERDICTS",
                "NOT_JUDGED_VERDICTS", "NOT_RUN_VERDICTS", "RAN_VERDICTS", "RecordMaker",
                "SEVERITY", "TENSORS", "VERDICTS", "handled_crash", "make_record"),
    "outcome": ("NothingRan", "REASON_CHARS", "nothing_ran", "ran_count"),
    "schema": ("check_record",),
    "store": ("MANIFEST", "RECORDS", "RunStore", "default_run_dir", "latest_run_dir",
              "load_manifest", "load_records", "stream_record_blocks", "stream_records",
              "sweep_case_ids"),
    "columnar": ("CASE_COLUMNS", "RecordBlock", "SCHEMA", "block_records",
                 "last_record_blocks"),
})
