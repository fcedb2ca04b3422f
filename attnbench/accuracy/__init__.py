"""Judging a case: is what a backend returned right?

:mod:`~.evaluate` is the one place both case runners judge a case; :mod:`~.bounds` holds the
error metrics and every bound, each beside the measurement behind it; :mod:`~.fused_baseline`
the precision of a correct fused kernel (blockwise, at every length); :mod:`~.invariants` the
reference-free gradient identities; :mod:`~.dropout_probe` hidden dropout masks, recovered or
judged by statistics (the generator replayed by :mod:`~.rng`, the fp64 side in
:mod:`~.dropout_exact`; masks that should be independent checked in
:mod:`~.dropout_independence`); :mod:`~.fp8_split` an fp8 case's error split into quantization and
kernel; :mod:`~.contract` what a backend returned against what the case asks for, before any of
it; :mod:`~.lse_check` a returned log-sum-exp against the reference's.
"""

from attnbench import package_face

__all__, __getattr__ = package_face(__name__, {
    "bounds": ("Check", "RATIO_FACTOR", "RATIO_FLOOR", "REFERENCE_SELF_BOUND", "Ruling",
               "identity_bounds", "split_sum_roundings", "tensor_errors"),
    "contract": ("check_backward", "check_forward"),
    "dropout_exact": ("ExactCall", "identity_columns", "visible_floor"),
    "dropout_independence": ("FALSE_ALARM", "MaskParts", "cp_parts", "expected_agreement",
                             "independence_check"),
    "dropout_probe": ("PROBE_CALL_LIMIT", "PROBE_ENTRY_LIMIT", "RecoveredKeepMask",
                      "judge_dropout"),
    "evaluate": ("Judgement", "References", "timed_only"),
    "fused_baseline": ("FusedBaseline", "fused_backward", "fused_forward"),
    "invariants": ("identity_residuals",),
    "lse_check": ("LSE_ROUNDINGS", "lse_bound", "lse_checks", "scores_dtype"),
    "rng": ("RngState", "default_generator"),
})
