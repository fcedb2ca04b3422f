"""Masks that should be independent are (attnbench.accuracy.dropout_independence): batch rows,
documents of a pack, heads (in a GQA group too) and CP parts, for recovered, statistics-probed
and exposed masks; the mutants sharing a mask are caught by both methods, correct kernels built
differently (sdpa, torch-RNG and seeded hidden masks, naive's exposed hash mask) pass.

Margins (value / bound of the catching check; p = 0.1, Sq = Sk = 128, 4 query heads on 2 KV
heads, fp32 / fp16 / bf16, seeds 0-2: ``python benchmarks/dropout_independence_margins.py``):
heads sharing a mask 8.97x, batch rows sharing one 17.8x, CP ranks from local offsets 11.7x
(ranks_mask_replay; bf16 independence of the CP parts 8.97x); correct controls (seeded and
torch-RNG hidden masks, naive's exposed mask, sdpa; one device, batch 2, pack, CP, TP) at most
0.42.
"""

from __future__ import annotations

import math

import pytest
import torch

from attnbench.accuracy.dropout_independence import (FALSE_ALARM, MaskParts, chernoff_excess,
                                                     expected_agreement, independence_check)
from attnbench.accuracy.dropout_probe import RngState, judge_dropout
from attnbench.accuracy.evaluate import evaluate
from attnbench.backends import get_backend
from attnbench.backends.sdpa import SdpaDefault
from attnbench.mutants.dropout import (DropoutBatchShareMask, DropoutHeadsShareMask,
                                       HiddenSeedDropout, HiddenTorchRngDropout)
from attnbench.problem.attn_spec import AttnSpec
from attnbench.problem.inputs import make_inputs
from attnbench.sweep.case import make_case

BASE = dict(backend="sdpa", seqlen_q=128, heads_q=4, heads_kv=2, head_dim=32, dtype="bf16",
            dropout=0.1)
MIN_MARGIN = 2.0
PACK = dict(seqlens_q=[60, 3, 65], seqlen_q=128, mask="causal", batch=1)


def _case(**fields):
    return make_case("test", {**BASE, **fields})


def _judge(backend, case, force_statistics=False):
    spec = AttnSpec.from_case(case)
    q, k, v, _ = make_inputs(case)
    rng = RngState.for_call("cpu", spec.dropout_seed)
    rng.restore()
    out = backend.forward(q, k, v, spec).out
    return judge_dropout(backend, q, k, v, spec, out, rng, force_statistics=force_statistics)


def _independence(judged):
    return next(c for c in judged.checks if c.check == "dropout_independence")


# -- the statistic --------------------------------------------------------------------------------


def test_chernoff_bound_is_a_few_sigmas_and_refuses_pairs_without_power():
    a = expected_agreement(0.1)
    assert a == pytest.approx(0.82)
    sigma = math.sqrt(a * (1 - a) / 1e6)
    assert 6.0 < chernoff_excess(10 ** 6, a) / sigma < 7.5  # ~6.8 sigma for large n
    assert chernoff_excess(100, a) > chernoff_excess(1000, a) > chernoff_excess(10000, a)
    assert chernoff_excess(50, a) == math.inf  # even 50 of 50 agreeing would be no evidence
    assert FALSE_ALARM <= 1e-10


def test_random_masks_pass_and_shared_ones_fail_naming_the_pair():
    gen = torch.Generator().manual_seed(3)
    spec = AttnSpec(scale=1.0, dropout_p=0.3)
    visible = torch.ones(2, 8, 32, 48, dtype=torch.bool)
    worst = 0.0
    for _ in range(20):  # 20 x (1 batch pair + 28 head pairs): none comes near the bound
        keep = torch.rand(2, 8, 32, 48, generator=gen) >= 0.3
        check = independence_check(keep, visible, spec, heads_kv=2)
        assert check.passed, check.describe()
        worst = max(worst, check.value / check.bound)
    assert worst < 0.6
    keep[:, 5] = keep[:, 4]  # two heads of one GQA group (4 query heads per KV head) share
    check = independence_check(keep, visible, spec, heads_kv=2)
    assert not check.passed and check.value / check.bound > 5
    assert "query heads 4 and 5 (one GQA group" in check.note
    keep[1] = keep[0]
    check = independence_check(keep, visible, spec, heads_kv=2)
    assert "batch rows 0 and 1" in check.note or "query heads 4 and 5" in check.note


def test_only_entries_visible_in_both_count():
    spec = AttnSpec(scale=1.0, dropout_p=0.1)
    keep = torch.rand(1, 2, 64, 64, generator=torch.Generator().manual_seed(0)) >= 0.1
    keep[:, 1] = keep[:, 0]
    visible = torch.zeros_like(keep)
    visible[:, 0, :32] = True
    visible[:, 1, 32:] = True  # the shared entries are never both visible
    check = independence_check(keep, visible, spec, heads_kv=2)
    assert check.passed and "no two masks" in check.note


def test_cp_parts_that_repeat_each_other_fail():
    spec = AttnSpec(scale=1.0, dropout_p=0.1)
    keep = torch.rand(1, 1, 64, 64, generator=torch.Generator().manual_seed(1)) >= 0.1
    visible = torch.ones_like(keep)
    parts = MaskParts(None, ((0, 32), (32, 64)), ((0, 32), (32, 64)))
    assert independence_check(keep, visible, spec, 1, parts=parts).passed
    keep[..., 32:, :] = keep[..., :32, :]  # rank 1's rows drawn as rank 0's
    check = independence_check(keep, visible, spec, 1, parts=parts)
    assert not check.passed and "CP parts" in check.note


# -- mutants, by both methods -----------------------------------------------------------------------

MUTANTS = [(DropoutHeadsShareMask, dict()), (DropoutBatchShareMask, dict(batch=2)),
           (DropoutBatchShareMask, PACK)]


@pytest.mark.parametrize("force_statistics", [False, True], ids=["recovered", "statistics"])
@pytest.mark.parametrize("mutant, fields", MUTANTS, ids=["heads", "batch", "pack-documents"])
def test_shared_masks_are_caught(mutant, fields, force_statistics):
    judged = _judge(mutant(), _case(**fields), force_statistics)
    assert judged.method == ("statistics" if force_statistics else "recovered-mask")
    check = _independence(judged)
    if force_statistics and "seqlens_q" in fields:
        # a few probed columns of one pack row: documents are not compared there (the
        # recovered mask compares them); heads are, and this mutant shares none
        assert check.passed
        return
    assert not check.passed and check.value / check.bound >= MIN_MARGIN, check.describe()
    axis = "query heads" if mutant is DropoutHeadsShareMask else \
        "documents" if "seqlens_q" in fields else "batch rows"
    assert axis in check.note


@pytest.mark.parametrize("force_statistics", [False, True], ids=["recovered", "statistics"])
@pytest.mark.parametrize("backend", [HiddenSeedDropout, HiddenTorchRngDropout, SdpaDefault])
@pytest.mark.parametrize("fields", [dict(batch=2), dict(heads_kv=1, mask="causal")],
                         ids=["batch2-gqa", "mqa-causal"])
def test_correct_hidden_masks_pass(backend, fields, force_statistics):
    judged = _judge(backend(), _case(**fields), force_statistics)
    check = _independence(judged)
    assert check.passed and check.value / check.bound < 0.5, check.describe()
    assert judged.details["independence_pairs"]["heads"] == 6


def test_seeded_hidden_pack_passes_with_documents_compared():
    judged = _judge(HiddenSeedDropout(), _case(**PACK))
    assert judged.details["independence_pairs"] == {"documents": 1, "heads": 6}
    assert judged.passed, [c.describe() for c in judged.checks if not c.passed]


@pytest.mark.parametrize("fields", [dict(batch=2), PACK], ids=["batch2", "pack"])
def test_an_exposed_mask_is_checked_too(fields):
    """naive's hash mask (exposed): the reference judges with it, and its independence is
    checked like a recovered mask's."""
    case = _case(backend="naive", **fields)
    spec = AttnSpec.from_case(case)
    q, k, v, dout = make_inputs(case)
    naive = get_backend("naive")
    fwd = naive.forward(q, k, v, spec)
    judgement = evaluate(case, naive, spec, q, k, v, dout, fwd.out, naive.backward(fwd.ctx, dout))
    assert judgement.verdict == "pass", judgement.reason
    assert judgement.accuracy["reference"] == "exact-mask"
    assert judgement.accuracy["dropout"]["method"] == "exposed-mask"
    check = next(c for c in judgement.checks if c.check == "dropout_independence")
    assert check.passed and check.value / check.bound < 0.5
