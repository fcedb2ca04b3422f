"""Bugs of packed (variable-length) attention: the layout's offsets and its boundaries.

Both edit ``naive``'s packed path (:meth:`NaiveBackend.forward` runs each sequence of the pack
with :func:`attnbench.problem.packing.per_sequence`): the correct backend is ``naive`` itself, which
the selftest runs on the same packed cases as a control. On dense cases both are plain ``naive``.
"""

from __future__ import annotations

from attnbench.backends.naive import NaiveBackend


class CuSeqlensOffByOne(NaiveBackend):
    """Every boundary inside the pack one token late: ``cu_seqlens`` built from the lengths with
    an inclusive/exclusive slip (the offsets are ``F.pad(lengths.cumsum(0), (1, 0))``,
    Dao-AILab/flash-attention#880; zhuzilin/ring-flash-attention#78 sliced ``cu_seqlens[:1]``
    for ``cu_seqlens[:-1]``). Sequence b > 0 loses its first token to sequence b - 1 and starts
    one row late; the first and last offsets stay right, so shapes and totals still agree."""

    name = "mutant.cu_seqlens_off_by_one"

    def forward(self, q, k, v, spec):
        if spec.is_packed:
            def late(cu):
                return (cu[0], *(min(x + 1, cu[-1]) for x in cu[1:-1]), cu[-1])  # BUG: + 1

            spec = spec.replace(cu_seqlens_q=late(spec.cu_seqlens_q),
                                cu_seqlens_kv=late(spec.cu_seqlens_kv))
        return super().forward(q, k, v, spec)


class CrossDocumentLeak(NaiveBackend):
    """The pack attended as one long sequence: document boundaries ignored, so a causal query
    sees every earlier document (packing without ``cu_seqlens`` / document-relative position
    ids: alex-hh/profam#495, huggingface/nanoVLM#204, mosaicml/llm-foundry#1464's "full lower
    triangular matrix"). Sequence 0 is still right, every later one is wrong."""

    name = "mutant.cross_document_leak"

    def forward(self, q, k, v, spec):
        if spec.is_packed:
            spec = spec.replace(cu_seqlens_q=(), cu_seqlens_kv=())  # BUG: boundaries dropped
        return super().forward(q, k, v, spec)


class EmptyDocumentNan(NaiveBackend):
    """A document with queries and no keys (a zero-length ``seqlens_kv`` entry: a padded slot of a
    varlen batch, a cache not filled yet) outputs 0/0: a flash-style kernel's loop over key
    blocks runs zero times and its final ``acc / l`` divides by l = 0, unguarded -- the 0/0 of
    a fully masked row (pytorch/pytorch#41508) reached through the layout instead of a mask. The
    rows of every other document, and every gradient, stay right."""

    name = "mutant.empty_document_nan"

    def attend(self, q_in, k_in, v_in, spec, masks):
        out, lse = super().attend(q_in, k_in, v_in, spec, masks)
        if k_in.shape[2] == 0:
            out = out + float("nan")  # BUG: acc / l with l = 0 (no key block was visited)
        return out, lse
