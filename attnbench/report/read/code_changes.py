"""What changed in the code under test between two runs: each backend's code, and the options.

Two runs of one sweep compare the same cases; whether they compare the same *code* is another
matter. Every record names its backend's code (``env.backend``: module, distribution version,
and the sha256 of the module's source file, :func:`attnbench.hardware.backend_fingerprint`), and
the manifest the run's options (timing, accuracy, kernel configs). ``attnbench compare`` says,
per backend, what differs -- a SLOW case whose backend's source changed is the edit's doing; an
unchanged source points at the machine -- and which option differs, since options change how
every backend is timed and judged. Old records without ``env.backend`` say nothing (not a
difference). Values come from files: each is shortened here and escaped where printed.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Optional

from attnbench.errors import short_repr

CODE_FIELDS = (("module", "module"), ("version", "version"), ("source", "source_sha256"))
"""(label, env.backend key): what tells one backend's code from another's."""
MAX_VALUE = 64  # characters of one value in a warning: a hash prefix or a version fits


class BackendCodeTally:
    """:func:`backend_code` of records added one at a time (a report reads its journal once,
    streamed); a few keys per backend, whatever the number of records."""

    def __init__(self) -> None:
        self.seen: dict[str, Counter] = {}

    def add(self, rec: Any) -> None:
        env = rec.get("env") if isinstance(rec, dict) else None
        code = env.get("backend") if isinstance(env, dict) else None
        case = rec.get("case") if isinstance(rec, dict) else None
        name = case.get("backend") if isinstance(case, dict) else None
        if not isinstance(code, dict) or not isinstance(name, str):
            return
        key = tuple((k, _text(code.get(k))) for _, k in CODE_FIELDS if k in code)
        self.seen.setdefault(name, Counter())[key] += 1

    def merge(self, other: "BackendCodeTally") -> None:
        """Add what ``other`` tallied of the records after these (order matters: a tie goes
        to the code seen first, and the backends stay in the order first seen)."""
        for name, counts in other.seen.items():
            mine = self.seen.setdefault(name, Counter())
            for key, n in counts.items():
                mine[key] += n

    def result(self) -> dict[str, dict[str, Any]]:
        return {name: dict(counts.most_common(1)[0][0]) for name, counts in self.seen.items()}


def backend_code(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """backend name -> its code (the most common ``env.backend`` among the run's records of it;
    a run resumed after an edit has two: the one most cases ran with stands for the run)."""
    tally = BackendCodeTally()
    for rec in records:
        tally.add(rec)
    return tally.result()


def _text(value: Any) -> Optional[str]:
    if value is None:
        return None
    return (value if isinstance(value, str) else short_repr(value))[:MAX_VALUE]


def backend_warnings(a: Iterable[dict[str, Any]] | dict[str, dict[str, Any]],
                     b: Iterable[dict[str, Any]] | dict[str, dict[str, Any]]) -> list[str]:
    """Given records, or each run's :func:`backend_code` (a loaded run's ``backend_code``):
    ``backend 'mine:Backend' differs: source 763ae9d4ddeb -> 4e21dcc8c544``, one line per
    backend both runs ran whose code differs (a field either side lacks is not compared)."""
    code_a, code_b = (side if isinstance(side, dict) else backend_code(side) for side in (a, b))
    lines = []
    for name in sorted(set(code_a) & set(code_b)):
        ca, cb = code_a[name], code_b[name]
        changed = [f"{label} {ca[key]} -> {cb[key]}" for label, key in CODE_FIELDS
                   if key in ca and key in cb and ca[key] != cb[key]]
        if changed:
            lines.append(f"backend {name[:MAX_VALUE]!r} differs: {'; '.join(changed)} (its "
                         "times and verdicts compare different code)")
    return lines


def _flat(options: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(options, dict):
        return {}
    out: dict[str, Any] = {}
    for key, value in options.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat(value, name + "."))
        else:
            out[name] = value
    return out


def options_warnings(manifest_a: dict[str, Any], manifest_b: dict[str, Any]) -> list[str]:
    """``runs differ in options: timing.min_samples 3 -> 20 (every backend ...)``: one line
    when the runs' options differ (either manifest without options: not compared)."""
    if not isinstance(manifest_a.get("options"), dict) or \
            not isinstance(manifest_b.get("options"), dict):
        return []
    fa, fb = _flat(manifest_a["options"]), _flat(manifest_b["options"])
    changed = [f"{k[:MAX_VALUE]} {_text(fa.get(k))} -> {_text(fb.get(k))}"
               for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]
    if not changed:
        return []
    return ["runs differ in options: " + "; ".join(changed) + " (every backend is timed or "
            "judged under other settings)"]
