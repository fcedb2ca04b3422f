"""``attnbench export``: a run's records as one flat table, in csv, json or parquet.

``command`` (the formats and the command), ``chunks`` (the table in chunks, each typed as the
whole), ``rows`` (csv and json written from the rows, as the frames would print them),
``pool`` (the same from rows read by several processes: ``--jobs``).
"""

from attnbench import package_face

__all__, __getattr__ = package_face(__name__, {
    "command": ("add_export_command", "csv_chunks", "export_chunks", "export_frame",
                "export_runs", "from_rows", "json_chunks", "parquet_chunks"),
})
