"""Forward dropout bugs behind a hidden mask, and the correct hidden-mask kernel they edit.

The first three are ``naive`` with one change: every forward draws a fresh keep mask from torch's RNG
(``torch.rand`` on the device's default generator, as SDPA's math path draws its
``bernoulli_``) and does not expose it (``keep_mask = None``), like flash-attn, cuDNN, SDPA and
TransformerEngine. The mask is then a function of the RNG state and the shapes (B, Hq, Sq, Sk)
only. Backward is autograd through the forward's own mask, consistent with forward, so the
gradient identities of :mod:`attnbench.accuracy.invariants` hold: only
:mod:`attnbench.accuracy.dropout_probe` (the recovered mask under the fp64 reference, or the keep
rate / scale / row-sum / bias statistics) can see the two bugs.

Then :class:`HiddenSeedDropout`, is the other kind of hidden mask: a pure function of the
seed the kernel is handed (``spec.dropout_seed``) and of global positions, as a custom Triton
kernel that takes a seed argument draws it. A correct one; the harness must judge it as fairly
as the torch-RNG kind (issue 26: it failed every CP/TP dropout case before the harness varied
the seed across its statistics runs).

The last three edit it: masks that should be independent and are not -- shared by the heads,
by the batch rows (and the documents of a pack), or repeated by every CP rank -- which only
:mod:`attnbench.accuracy.dropout_independence` sees (each mask alone is a fine draw, and
forward and backward agree).

Legend: B = batch, Hq = query heads, Sq / Sk = lengths.
"""

from __future__ import annotations

import torch

from attnbench.backends.masks import dense_masks
from attnbench.backends.naive import NaiveBackend
from attnbench.mutants.patch import mutated, rebound


class HiddenTorchRngDropout(NaiveBackend):
    """Control: correct dropout -- keep with probability 1 - p, scale by 1 / (1 - p) -- drawn
    from torch's RNG at every call, mask hidden. Must pass every dropout check: the false-alarm
    control for the two mutants below, which edit it."""

    name = "mutant.hidden_rng_dropout"
    keep_mask = None
    supports_packed = False  # draws one (B, Hq, Sq, Sk) mask for the whole call

    def build_masks(self, spec, q, k):
        batch, heads_q, sq, _ = q.shape
        return dense_masks(spec, batch, heads_q, sq, k.shape[2], q.dtype, q.device, keep=False)

    def masks(self, spec, q, k):
        """The cached bias / visibility, and a keep mask (B, Hq, Sq, Sk) drawn now."""
        bias, visible, _ = super().masks(spec, q, k)
        if spec.dropout_p <= 0:
            return bias, visible, None
        return bias, visible, self.draw_keep(spec, q, k)

    def draw_keep(self, spec, q, k):
        batch, heads_q, sq, _ = q.shape
        uniform = torch.rand(batch, heads_q, sq, k.shape[2], device=q.device)
        return uniform >= spec.dropout_p


class DropoutKeepP(HiddenTorchRngDropout):
    """Forward keeps each probability with probability p instead of 1 - p, and still scales by
    1 / (1 - p): the threshold compared the wrong way round, the confusion of a keep probability
    (TF1's ``keep_prob``) with a drop probability (v-iashin/CS231n#8: "the ratio of zero
    elements will be 0.9 instead of 0.1"; google-research/electra#61, tensorpack/tensorpack#786).
    Self-consistent, so the fp64 reference with the recovered mask agrees with it: the keep rate
    and the bias of the mean output show it."""

    name = "mutant.dropout_keep_p"
    draw_keep = mutated(HiddenTorchRngDropout.draw_keep, "return uniform >= spec.dropout_p",
                        "return uniform < spec.dropout_p  # BUG: keeps with probability p")


class DropoutRenormalised(HiddenTorchRngDropout):
    """Forward renormalises the probabilities over the kept keys (a softmax over the kept
    entries) instead of scaling by 1 / (1 - p): the mask applied to the scores (-inf) before
    the softmax, or the normaliser summed after dropout -- the "fix" proposed in
    facebookresearch/fairseq#351 and huggingface/transformers#31468 so that rows sum to 1.
    Every output row is again a convex combination of V, so row sums of P are exactly 1 instead
    of varying around 1, and the output differs from the fp64 reference with the recovered mask
    by a few percent."""

    name = "mutant.dropout_renormalised"
    attend = mutated(
        NaiveBackend.attend,
        "probs = probs * (keep.to(q_in.dtype) / (1.0 - spec.dropout_p)).to(q_in.dtype)",
        "kept = probs.float() * keep  # BUG: renormalised over the kept keys, not / (1 - p)\n"
        "            probs = (kept / kept.sum(-1, keepdim=True).clamp_min(1e-30)).to(q_in.dtype)")


class HiddenSeedDropout(NaiveBackend):
    """Control: ``naive`` (correct, fp32 in fp32 cases) with its mask hidden (``keep_mask =
    None``): the mask is :func:`attnbench.problem.dropout.hash_keep_mask` of ``spec.dropout_seed``
    and global positions, so it ignores torch's RNG and replays whenever the seed does. Packed
    and CP/TP as ``naive``. Must pass every dropout case of every default sweep."""

    name = "mutant.hidden_seed_dropout"
    keep_mask = None


class DropoutSeedIgnored(HiddenSeedDropout):
    """The seeded kernel reads a seed that never changes instead of the one it is handed: the
    same mask at every call, every step (xformers#173: the seed's memory address used as the
    seed; vllm-project/vllm#55009: a seed taken from a data pointer). Forward and backward
    agree, every mask is a fine draw on its own: the redraw check of a recovered mask, or the
    mean of the statistics' runs, shows it."""

    name = "mutant.dropout_seed_ignored"

    def masks(self, spec, q, k):
        return super().masks(spec.replace(dropout_seed=_STUCK_SEED), q, k)


_STUCK_SEED = 1234
"""The seed the mutant reads whatever it is handed (any constant is the bug)."""


_KEEP_DRAW = "keep_mask = hash_keep_mask(spec, batches, heads, q_pos, k_pos)"


def _drawn_by(new: str):
    """naive's ``build_masks`` whose keep mask is drawn by ``new`` instead of _KEEP_DRAW."""
    return rebound(NaiveBackend.build_masks, dense_masks=mutated(dense_masks, _KEEP_DRAW, new))


class DropoutHeadsShareMask(HiddenSeedDropout):
    """The seeded kernel leaves the head out of its RNG counter: every head of a batch row
    draws the same mask (flash-attn keys its Philox offset by batch and head,
    Dao-AILab/flash-attention#612; a counter built without one of them, or threads that own
    different elements computing one Philox key, Dao-AILab/flash-attention#2439, repeats
    masks). Each mask is a fine draw: only the agreement between heads shows it."""

    name = "mutant.dropout_heads_share_mask"
    build_masks = _drawn_by("keep_mask = hash_keep_mask(spec, batches, torch.zeros_like(heads), "
                            "q_pos, k_pos)  # BUG: no head in the counter")


class DropoutBatchShareMask(HiddenSeedDropout):
    """The seeded kernel leaves the batch row out of its RNG counter: every batch row -- and
    every document of a pack, numbered as batch rows -- draws the same mask (the same class
    as :class:`DropoutHeadsShareMask`, the other index)."""

    name = "mutant.dropout_batch_share_mask"
    build_masks = _drawn_by("keep_mask = hash_keep_mask(spec, torch.zeros_like(batches), heads, "
                            "q_pos, k_pos)  # BUG: no batch row in the counter")


class CpDropoutLocalOffsets(HiddenSeedDropout):
    """The seeded kernel keys its RNG counter by the call's own rows and keys, not by their
    positions in the sequence (it takes q_start / kv_start for the causal offset only): right on
    one device, where they coincide; under CP every rank's block draws the mask of rank 0's, so
    ranks repeat each other (NVIDIA/makani#40 added a ring-aware dropout for this;
    awslabs/slapo#21: partitioned attention dropout needs its own random stream per part)."""

    name = "mutant.cp_dropout_local_offsets"
    build_masks = _drawn_by("keep_mask = hash_keep_mask(spec, batches, heads, q_pos - spec.q_start, "
                            "k_pos - spec.kv_start)  # BUG: local rows and keys")
