"""Sweep files and the cases they expand to.

:mod:`~.load` reads a sweep file (defaults, axes that are crossed, exclusions, includes) into a
:class:`~.load.Sweep` of :class:`~.case.Case` records, every mistake one line ``FILE: FIELD: got
X, expected Y``, all in one pass (:mod:`~.one_pass`: the cases are checked despite wrong
fields, a cause many cases share said once). :mod:`~.case` holds the case and the rule of every field; :mod:`~.axes` ranges,
zipped groups and ``-s`` overrides; :mod:`~.options` the harness options; :mod:`~.packed_rules`,
:mod:`~.length_mix`, :mod:`~.decode_rules`, :mod:`~.fp8_rules` and :mod:`~.capture_rules` the rules of packed, decode,
fp8 and captured cases; :mod:`~.flops` the one work model (FLOPs and minimal bytes of a case, read by the
timing on the ranks and by the reports); :mod:`~.schema` the JSON Schema editors check sweeps
with; :mod:`~.coverage` which pairs of feature values a set of sweeps never puts together.
"""

from attnbench import package_face

__all__, __getattr__ = package_face(__name__, {
    "capture_rules": ("CAPTURED", "resolve_capture"),
    "case": ("ATTENTION_KINDS", "CASE_FIELDS", "CP_ALGOS", "Case", "DRAWN_INPUTS", "MAX_CASES",
             "MAX_RANKS", "PUBLIC_FIELDS", "RING_ALGOS", "attention_kind", "case_dict_passes",
             "case_fields", "case_value_passes", "check_case_dict", "make_case"),
    "coverage": ("FEATURES", "Coverage", "excluded", "meaningful_pairs", "pair_coverage",
                 "values"),
    "flops": ("BACKWARD_FACTOR", "case_bytes", "case_flops", "decode_bytes", "visible_pairs"),
    "length_mix": ("expand",),
    "load": ("Sweep", "load_sweep", "parse_sweep", "single_case_sweep"),
    "one_pass": ("Doubt", "SharedCauses", "shared_line", "valid_part"),
    "options": ("FLOOR_CAP", "FLOOR_WALL_CAP", "RunOptions", "TimingOptions", "check_options_dict"),
    "packed_rules": ("MAX_SEQUENCES",),
    "schema": ("add_schema_command", "schema_text", "sweep_schema"),
})
