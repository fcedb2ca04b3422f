"""Before the first case: can every worker import the sweep's ``module:object`` backends?

Without this look a backend module a worker cannot import made every case of that backend an
``error`` after it had been scheduled and started (``ModuleNotFoundError``, once per case).
Each worker answers for itself and for the rank processes it starts (they inherit its
environment and directory; :mod:`attnbench.backends.importable` imports nothing).
"""

from __future__ import annotations

from typing import Iterable

from attnbench.backends import backend_names
from attnbench.backends.importable import one_line, third_party, unimportable
from attnbench.errors import UserError


def check_workers_import(client, backends: Iterable[str]) -> None:
    """Raise :class:`~attnbench.errors.UserError` (exit 2), one line per backend, when a worker
    of ``client`` cannot locate the module of one of ``backends``. A worker that cannot be
    asked (it left meanwhile) is passed over: its cases would tell."""
    refs = third_party(backends, backend_names())
    if not refs:
        return
    answers = client.run(unimportable, refs, on_error="ignore")
    lines: dict[str, str] = {}
    for worker, missing in sorted(answers.items()):
        for ref, reason in (missing or {}).items():
            lines.setdefault(ref, one_line(ref, reason, f"worker {worker}"))
    if lines:
        raise UserError("\n".join(f"{line} (no case was run)" for line in lines.values()))
