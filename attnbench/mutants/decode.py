"""Decode bugs: a paged cache addressed wrongly, and a split-KV merge without the max.

The paged mutants edit :func:`attnbench.problem.paged.gather_kv` (how ``naive`` reads a paged cache,
token by token, as a paged kernel addresses it); the merge mutant edits
:func:`attnbench.kernels.decode.merge_splits_torch` and runs our split-KV kernel with it. All are forward
bugs of forward-only cases: only the fp64 reference (and NaN counts) can see them.
"""

from __future__ import annotations

from attnbench.backends.naive import NaiveBackend
from attnbench.mutants.patch import mutated, rebound
from attnbench.problem import paged


def _reads_with(gather):
    """NaiveBackend.cache_kv reading the pages through ``gather``."""
    return rebound(NaiveBackend.cache_kv, gather_kv=gather)


class PagedWrongSequence(NaiveBackend):
    """Sequence b's pages looked up in the block table at row offset b * (pages it uses)
    instead of b * (the table's row stride): the table is wider than a sequence needs
    (``max_num_blocks_per_seq``, Dao-AILab/flash-attention#785), so every sequence after the
    first reads part of another sequence's row -- another sequence's keys
    (tenstorrent/tt-metal#45193: a padded page table read another user's block)."""

    name = "mutant.paged_wrong_sequence"
    cache_kv = _reads_with(mutated(
        paged.gather_kv, "* cache.block_table.stride(0)",
        "* -(-cache.max_seqlen // cache.page_size)  # BUG: pages used, not the row stride"))


class PageBoundaryOffByOne(NaiveBackend):
    """The page of token t taken from its 1-based position, (t + 1) // T: the last slot of
    every page is read from the next page of the table (pegainfer-project/pegainfer#291, one
    page past the sequence at block boundaries; EricLBuehler/mistral.rs#552)."""

    name = "mutant.page_boundary_off_by_one"
    cache_kv = _reads_with(mutated(
        paged.gather_kv, "page = table[row + pos // cache.page_size]",
        "page = table[row + (pos + 1) // cache.page_size]  # BUG: 1-based position"))


def _split_merge_backend():
    """TritonBackend is imported lazily: it imports triton (the registry must not)."""
    from attnbench.kernels.decode import merge_splits_torch

    from attnbench.backends.triton_backend import TritonBackend

    no_max = mutated(merge_splits_torch, "w = torch.exp(lse_part - m)",
                     "w = torch.exp(lse_part.to(dtype)).float()  # BUG: no max, in the "
                     "activations' dtype")

    class SplitMergeNoMax(TritonBackend):
        """Our split-KV decode kernel whose merge weights each split by exp(lse_s), without
        subtracting the largest lse first, in the activations' dtype (the ring CP bug of
        catalogue 8, in flash-decoding's combine: SHI-Labs/NATTEN#202,
        HKUSTDial/flash-sparse-attention#265). exp(lse) overflows fp16 once lse > 11: with
        large logits inf / inf is NaN."""

        name = "mutant.split_merge_no_max"

        def supports(self, case, device):
            return super().supports(case, device) or (
                None if case.decode else "decode cases only (a mutant of the decode merge)")

        def decode(self, q, k, v, spec, params, merge=None):
            return super().decode(q, k, v, spec, params, merge=no_max)

    return SplitMergeNoMax()


SplitMergeNoMax = _split_merge_backend
