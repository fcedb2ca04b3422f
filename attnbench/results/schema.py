"""The schema of what a run directory holds: every journal record and the manifest checked,
every mistake one line naming where (run directories travel between people: a hand-edited or
foreign one must not become a traceback deep in a report)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnbench.errors import RunDirError, SweepError, short_repr, shown_key
from attnbench.results.records import VERDICTS
from attnbench.sweep.case import case_dict_passes, check_case_dict
from attnbench.sweep.options import check_options_dict

# What makes two records' environments different enough to say so (see ``RunStore.append``).
ENV_KEYS = ("gpu_kind", "driver_version", "cuda_runtime", "cudnn", "nccl", "torch", "triton",
            "commit", "dirty", "sm_clock_max_mhz", "sm_clock_app_mhz", "memory_clock_max_mhz",
            "power_limit_w", "power_limit_enforced_w")

_SCALAR = (str, int, float, bool, type(None))


def _bad(where: str, value: Any, expected: str) -> RunDirError:
    return RunDirError(f"{where}: got {short_repr(value)}, expected {expected}")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# Kinds of value a known field may hold (None is always allowed: "not recorded").
TEXT, NUMBER, FLAG, SCALAR, NUMBERS = "a string", "a number", "true or false", "a scalar", \
    "a list of numbers"
_KINDS = {TEXT: lambda v: isinstance(v, str), NUMBER: _number, FLAG: lambda v: isinstance(v, bool),
          SCALAR: lambda v: isinstance(v, _SCALAR),
          NUMBERS: lambda v: isinstance(v, list) and all(map(_number, v))}
_STATS = {**{k: NUMBER for k in ("median_ms", "q1_ms", "q3_ms", "min_ms", "n", "tflops",
                                 "pct_peak", "pct_measured_peak", "gbps", "pct_peak_bandwidth",
                                 "peak_memory_bytes",
                                 "calls_per_sample", "warmup_calls", "warmup_ms")},
          "samples_ms": NUMBERS, "noisy": FLAG,
          "timed_as": TEXT}  # "graph" or "eager" (a graph mode call that fell back)
_CLOCKS = {"sm_mhz": NUMBERS, "reasons": TEXT, "throttled": FLAG,
           **{k: NUMBER for k in ("sm_mhz_max", "power_violation_ms", "thermal_violation_ms",
                                  "energy_j")}}  # attnbench.hardware.clock_watch
_TIMING = {"clock": TEXT, "mode": TEXT, "note": TEXT,
           **{k: NUMBER for k in ("world_size", "l2_flush_bytes", "flops_fwd", "flops_bwd",
                                  "bytes_fwd", "bytes_bwd", "peak_tflops",
                                  "measured_peak_tflops", "peak_bandwidth_gbs")}}
_METRICS = {k: SCALAR for k in ("rel_l2", "max_abs", "cosine", "nonfinite", "baseline_rel_l2",
                                "ratio", "bound", "value", "baseline", "fused_rel_l2",
                                "fused_ratio")}
_CRASH = {"signal": TEXT, "stderr_tail": TEXT, "traceback": TEXT, "exit_code": NUMBER,
          "rank": NUMBER}
_CHECK = {"check": TEXT, "tensor": TEXT, "metric": TEXT, "value": SCALAR, "bound": SCALAR,
          "passed": SCALAR, "note": TEXT}
_ENV = {**{k: TEXT for k in ("host", "python", "attnbench", "device", "device_name", "gpu_kind",
                             "gpu_family", "torch", "triton", "worker", "worker_kind")},
        "pid": NUMBER}
_IDENTITY = {**{k: TEXT for k in ("name", "form_factor", "compute_capability", "driver_version",
                                  "cuda_driver_version", "uuid", "pci_bus_id", "device_type")},
             **{k: SCALAR for k in ("memory_total_gib", "memory_total_bytes", "sm_count",
                                    "sm_clock_max_mhz", "sm_clock_app_mhz", "memory_clock_max_mhz",
                                    "memory_clock_app_mhz", "power_limit_w",
                                    "power_limit_enforced_w", "ecc_enabled", "index")}}
_SOFTWARE = {**{k: TEXT for k in ("python", "torch", "triton", "cuda_runtime", "cudnn", "nccl",
                                  "driver_version", "cuda_driver_version", "commit",
                                  "commit_date", "attnbench")}, "dirty": SCALAR}
_COMPILE = {"mode": TEXT, "interpreted": FLAG, "variant": TEXT, "note": TEXT,
            **{k: NUMBER for k in ("seconds", "kernels", "autotune_s", "fp8_max_imprecise_acc")}}
_TILE = {k: NUMBER for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")}
_RECORD = {**{k: TEXT for k in ("label", "features", "reason", "started")},
           "duration_s": NUMBER, "wall_s": NUMBER}


def _obj(where: str, value: Any, fields: dict[str, str]) -> dict:
    """``value`` is None or an object whose known ``fields`` hold their kind (or null); other
    keys are left alone (a newer attnbench may add them). Returns it, ``{}`` for None."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad(where, value, "an object")
    for key, kind in fields.items():
        v = value.get(key)
        if v is not None and not _KINDS[kind](v):
            raise _bad(f"{where}.{key}", v, kind)
    return value


def _objects(where: str, value: Any, fields: dict[str, str]) -> None:
    """An object of such objects (``accuracy.tensors``: tensor -> metrics)."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise _bad(where, value, "an object")
    for key, v in value.items():
        _obj(f"{where}.{shown_key(key)}", v, fields)


# -- the same schema by exact type, for records that pass (no message built) -------------------
_EXACT = {TEXT: (str,), NUMBER: (int, float), FLAG: (bool,), SCALAR: _SCALAR}
"""Each kind's types, exactly: a JSON value is of one of them; anything else (a subclass, a
value made in memory) takes the slow path, which says whether it passes."""


def _table(fields: dict[str, str]) -> tuple:
    """A table of :func:`_obj` as :func:`_fits_obj` reads it: a tag (its shapes' key), (key,
    exact types) of the scalar fields, and the keys of the lists of numbers."""
    return (object(), tuple((k, _EXACT[kind]) for k, kind in fields.items() if kind != NUMBERS),
            tuple(k for k, kind in fields.items() if kind == NUMBERS))


_SHAPES: dict[tuple, bool] = {}
"""(table tag, keys, their values' types) -> whether the scalar fields pass: they do or not by
type alone, and a journal's objects come in a few shapes, so an object costs a look-up made in
C, not a loop over its fields (~3 us each, ten objects a record)."""
_SHAPES_MAX = 1 << 12
"""Shapes kept before :data:`_SHAPES` is emptied (a writer makes a few dozen; a hostile
journal may make one a line: the memory stays ~1 MiB)."""


def _fits_obj(value: Any, table) -> bool:
    """Whether :func:`_obj` passes ``value`` (None, or an object whose fields hold their kind),
    by exact type: True only where it does."""
    if value is None:
        return True
    if type(value) is not dict:
        return False
    tag, scalars, lists = table
    shape = (tag, tuple(value), tuple(map(type, value.values())))
    ok = _SHAPES.get(shape)
    if ok is None:
        get = value.get
        ok = all(v is None or type(v) in types for v, types in
                 ((get(key), types) for key, types in scalars))
        if len(_SHAPES) >= _SHAPES_MAX:
            _SHAPES.clear()
        _SHAPES[shape] = ok
    if not ok:
        return False
    for key in lists:
        v = value.get(key)
        if v is not None and not (type(v) is list
                                  and all(type(x) is float or type(x) is int for x in v)):
            return False
    return True


def _fits_objects(value: Any, table) -> bool:
    """:func:`_fits_obj` of :func:`_objects`."""
    if value is None:
        return True
    return type(value) is dict and all(_fits_obj(v, table) for v in value.values())


_NESTED = ((("crash",), _CRASH, False),
           (("timing",), _TIMING, False),
           (("timing", "fwd"), _STATS, False),
           (("timing", "bwd"), _STATS, False),
           (("timing", "clocks_fwd"), _CLOCKS, False),  # on a GPU with NVML
           (("timing", "clocks_bwd"), _CLOCKS, False),
           (("compile",), _COMPILE, False),  # optional: newer records
           (("compile", "configs"), _TILE, True),
           (("accuracy",), {"reference": TEXT}, False),
           *((("accuracy", section), _METRICS, True)
             for section in ("tensors", "identities", "parity")),
           (("env",), _ENV, False),
           (("env", "identity"), _IDENTITY, False),
           (("env", "software"), _SOFTWARE, False))
"""The record's objects, in the order they are checked: (path, fields, whether it is an object
of such objects). A parent comes before its children, so a child's parent is None or an
object when it is reached. Both :func:`_check_record` and :func:`_fits` walk this table."""


def _at(rec: dict, path: tuple[str, ...]) -> Any:
    """The value at ``path``, None where a parent is absent (parents are checked first)."""
    value = rec
    for key in path:
        value = value.get(key) if value is not None else None
    return value


_RECORD_T, _CHECK_T = _table(_RECORD), _table(_CHECK)
_NESTED_T = tuple((path[0], path[1] if len(path) > 1 else None,
                   _fits_objects if many else _fits_obj, _table(fields))
                  for path, fields, many in _NESTED)
""":data:`_NESTED` as :func:`_fits` walks it: (key, child key or None, check, table)."""
assert all(len(path) <= 2 for path, _, _ in _NESTED)
_VERDICT_SET = frozenset(VERDICTS)


def _fits(rec: Any) -> bool:
    """Whether :func:`_check_record` passes ``rec``, by exact type and without a message:
    True only where it does (a bad case raises :class:`SweepError`). Field by field the same
    checks, in the same tables (:data:`_NESTED`)."""
    if type(rec) is not dict:
        return False
    get = rec.get
    rid = get("id")
    if type(rid) is not str or not 0 < len(rid) <= 64 or not rid.isprintable():
        return False
    if not case_dict_passes(get("case")):
        check_case_dict("case", get("case"))
    verdict = get("verdict")
    if type(verdict) is not str or verdict not in _VERDICT_SET or not _fits_obj(rec, _RECORD_T):
        return False
    attempt = get("attempt")
    if attempt is not None and not (type(attempt) is int and attempt >= 1):
        return False
    checks = get("checks")
    if checks is not None and not (type(checks) is list
                                   and all(_fits_obj(c, _CHECK_T) for c in checks)):
        return False
    for key, child, fits, table in _NESTED_T:  # a loop, not _at: ~4 us a record less
        value = get(key)
        if child is not None and value is not None:
            value = value.get(child)
        if not fits(value, table):
            return False
    return True


def check_record(where: str, rec: Any) -> dict:
    """One journal record checked against the schema of :mod:`attnbench.results.records`, as far as
    anything downstream reads it (``show``, reports, ``compare``, resume): its case through the
    sweep's own field rules, every other known field by kind. Fields it lacks are unknown;
    fields this version does not know are ignored. Raises :class:`RunDirError` naming the
    field. ``where``: ``FILE:LINE: `` (ends with a separator).

    Every reader checks every line (10^6 at a time, issue 29), so a record is first checked by
    :func:`_fits`, which builds no message (the where-strings of every field were ~20 us of the
    ~50 a record took); only a record it does not pass goes through :func:`_check_record`, which
    names the first bad field (or passes it: :func:`_fits` may refuse what is merely unusual)."""
    try:
        if _fits(rec):
            return rec
    except SweepError:  # its case is bad: said below, with the case's where
        pass
    return _check_record(where, rec)


def _check_record(where: str, rec: Any) -> dict:
    """:func:`check_record`, naming the first bad field (raises :class:`RunDirError`)."""
    if not isinstance(rec, dict):
        raise RunDirError(f"{where}got {short_repr(rec)}, expected a record (a JSON object, see "
                          "attnbench/results/records.py)")
    at = where.rstrip() + (" " if where else "")
    rid = rec.get("id")
    if not isinstance(rid, str) or not 0 < len(rid) <= 64 or not rid.isprintable():
        raise _bad(f"{at}id", rid, "a case id (a string of at most 64 characters)")
    try:
        check_case_dict(f"{at}case", rec.get("case"))
    except SweepError as exc:
        raise RunDirError(str(exc)) from None
    if rec.get("verdict") not in VERDICTS:
        raise _bad(f"{at}verdict", rec.get("verdict"), "one of " + ", ".join(VERDICTS))
    for key, kind in _RECORD.items():
        if rec.get(key) is not None and not _KINDS[kind](rec[key]):
            raise _bad(f"{at}{key}", rec[key], kind)
    attempt = rec.get("attempt")
    if attempt is not None and not (isinstance(attempt, int) and not isinstance(attempt, bool)
                                    and attempt >= 1):
        raise _bad(f"{at}attempt", attempt, "a positive integer")
    checks = rec.get("checks")
    if checks is not None and not isinstance(checks, list):
        raise _bad(f"{at}checks", checks, "a list of checks")
    for i, check in enumerate(checks or []):
        _obj(f"{at}checks[{i}]", check, _CHECK)
    for path, fields, many in _NESTED:
        (_objects if many else _obj)(at + ".".join(path), _at(rec, path), fields)
    return rec


_MANIFEST = {**{k: TEXT for k in ("run_id", "created", "attnbench", "client_host")}}
_MANIFEST_SWEEP = {**{k: TEXT for k in ("name", "path", "digest", "source", "description")},
                   "cases": NUMBER}
_DEVICE = {k: TEXT for k in ("host", "device", "gpu_kind", "device_name")}


def check_manifest(path: Path, data: Any) -> dict:
    """A manifest checked by kind, as far as anything reads it; unknown keys are kept."""
    if not isinstance(data, dict):
        raise _bad(f"{path}", data, "a JSON object (the run's manifest)")
    at = f"{path}: "
    for key, kind in _MANIFEST.items():
        if data.get(key) is not None and not _KINDS[kind](data[key]):
            raise _bad(f"{at}{key}", data[key], kind)
    _obj(f"{at}sweep", data.get("sweep"), _MANIFEST_SWEEP)
    for key in ("command", "hosts"):
        value = data.get(key)
        if value is not None and not (isinstance(value, list)
                                      and all(isinstance(v, str) for v in value)):
            raise _bad(f"{at}{key}", value, "a list of strings")
    environment = {**{k: SCALAR for k in ENV_KEYS}, "gpu_kind": TEXT}
    for key, fields in (("devices", _DEVICE), ("environments", environment), ("resumed", {})):
        value = data.get(key)
        if value is not None and not isinstance(value, list):
            raise _bad(f"{at}{key}", value, "a list of objects")
        for i, item in enumerate(value or []):
            if not isinstance(item, dict):
                raise _bad(f"{at}{key}[{i}]", item, "an object")
            _obj(f"{at}{key}[{i}]", item, fields)
    versions = _obj(f"{at}versions", data.get("versions"), {})
    for key, v in versions.items():
        if not isinstance(v, _SCALAR):
            raise _bad(f"{at}versions.{shown_key(key)}", v, SCALAR)
    if data.get("options") is not None:
        try:
            check_options_dict(f"{at}options", data["options"])
        except SweepError as exc:
            raise RunDirError(str(exc)) from None
    return data


