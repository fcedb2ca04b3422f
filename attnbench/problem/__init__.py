"""What one attention call means, and its exact answer.

:mod:`~.attn_spec` (:class:`AttnSpec`: the features of one backend call, in the conventions every
backend and the reference share), :mod:`~.packing` (packed variable-length layouts),
:mod:`~.paged` (the paged KV caches of decode cases), :mod:`~.dropout` (a keep mask that is a
pure function of positions), :mod:`~.fp8` (scaled fp8 quantization), :mod:`~.inputs` (the same
input numbers on every device and every rerun) and :mod:`~.reference` (exact fp64 attention:
the specification every backend is measured against).
"""
