"""A copy of the ``flex`` backend with one planted bug, as a user's ``module:object`` backend
(``flex_mutant:TopLeft``; tests/ is on sys.path): the causal diagonal aligned top-left.

Query i then sees keys 0..i -- SDPA's ``is_causal`` and the textbook FlexAttention
``causal_mask`` (``q_idx >= kv_idx``) -- where attnbench (and flash-attn) align it bottom-right,
query i at key ``i + Sk - Sq``. The two agree when Sq == Sk, so only a case with Sq != Sk can
catch it; ALiBi distances move with the diagonal too.
"""

from attnbench.backends.flex import FlexBackend


class TopLeft(FlexBackend):
    name = "flex-topleft"

    def prepared_call(self, spec, q, k):
        # the bug: the diagonal as if Sk == Sq (diagonal_offset 0), mask and ALiBi alike
        return super().prepared_call(spec.replace(seqlen_kv_total=spec.seqlen_q_total), q, k)
