"""What one attention call means, and its exact answer.

:mod:`~.attn_spec` (:class:`AttnSpec`: the features of one backend call, in the conventions every
backend and the reference share), :mod:`~.packing` (packed variable-length layouts),
:mod:`~.paged` (the paged KV caches of decode cases), :mod:`~.dropout` (a keep mask that is a
pure function of positions), :mod:`~.fp8` (scaled fp8 quantization), :mod:`~.inputs` (the same
input numbers on every device and every rerun) and :mod:`~.reference` (exact fp64 attention:
the specification every backend is measured against).
"""

from attnbench import package_face

__all__, __getattr__ = package_face(__name__, {
    "attn_spec": ("AttnSpec", "KeepMaskFn", "alibi_slopes"),
    "dropout": ("hash_keep_mask", "uniform01"),
    "fp8": ("FORMATS", "Fp8Format", "P_PRESCALE", "Quantized", "dequantize_call",
            "descale_tensors", "output_dtype", "quantize", "round_to_fp8", "torch_dtype",
            "with_descales"),
    "inputs": ("make_fp8_inputs", "make_inputs"),
    "packing": ("backward_per_sequence", "cu_seqlens", "cu_tensor", "forward_per_sequence",
                "from_thd", "per_sequence", "segments", "sequence_spec", "to_thd"),
    "paged": ("build_paged_cache", "decode_cache", "decode_queries", "gather_kv", "packed_like"),
    "reference": ("ScoreBlocks", "block_sizes", "grouped_f64", "reference_backward",
                  "reference_forward"),
})
