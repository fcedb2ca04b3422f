"""Sweep files and the cases they expand to.

:mod:`~.load` reads a sweep file (defaults, axes that are crossed, exclusions, includes) into a
:class:`~.load.Sweep` of :class:`~.case.Case` records, every mistake one line ``FILE: FIELD: got
X, expected Y``. :mod:`~.case` holds the case and the rule of every field; :mod:`~.axes` ranges,
zipped groups and ``-s`` overrides; :mod:`~.options` the harness options; :mod:`~.packed_rules`,
:mod:`~.length_mix`, :mod:`~.decode_rules` and :mod:`~.fp8_rules` the rules of packed, decode and
fp8 cases; :mod:`~.flops` the one work model (FLOPs and minimal bytes of a case, read by the
timing on the ranks and by the reports); :mod:`~.schema` the JSON Schema editors check sweeps
with.
"""
