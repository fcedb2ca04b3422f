"""The catalogue of attention bug classes, as data (no torch: the registry and the CLI read it).

Each entry is a backend (``mutant.*``) with one plausible bug, modeled on a public report;
``attnbench selftest`` runs them all through the standard sweep's checks and requires every one
to be caught, and every correct backend (``CONTROLS``) to pass.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class Mutant:
    name: str
    """Registered backend name."""
    ref: str
    """``module:object`` of the backend."""
    number: str
    """Catalogue number (issue 7's list 1-12, issue 12's 13-16, issue 15's 17-22: packed
    batches 17-18, decode 19-21, packed CP 22; issue 16's fp8 23-25), or "extra" for classes
    added from public reports."""
    bug: str
    """The bug class in one line."""
    report: str
    """The public report it models."""
    exposed_by: str
    """What a sweep must contain for the bug to show."""
    parallel: bool = False
    """Needs a CP/TP case (runs on a rank pool)."""
    single: bool = False
    """Takes only single-device cases: its control draws a fresh dropout mask per call from
    torch's RNG, which a CP ring (one call per step, backward recomputing) cannot replay."""
    decode: bool = False
    """Takes the decode cases (forward only, ``decode: true``) and only those; other mutants
    skip them (a backward bug has nothing to show there)."""
    fp8: bool = False
    """Takes the fp8 cases (``dtype: fp8_*``, forward only) and only those; other mutants
    skip them."""
    dropout: bool = False
    """Takes only the dropout cases (a bug of the dropout mask alone: elsewhere it is its
    correct control, and the case time is spent for nothing)."""
    long: bool = False
    """Needs the long cases of the sweep (seqlen >= LONG_SEQLEN): an error that grows with
    length. Other mutants skip those cases (they cost seconds each on a CPU)."""


M = "attnbench.mutants"
CATALOGUE: tuple[Mutant, ...] = (
    Mutant(name="mutant.cp_fresh_dropout", ref=f"{M}.parallel:CpFreshDropout", number="1",
           bug="CP ring backward draws a fresh dropout mask instead of replaying forward's",
           report="seed 000 (TransformerEngine CP backward without rng_state)",
           exposed_by="ring/zigzag CP with dropout", parallel=True),
    Mutant(name="mutant.dq_log2_scale", ref=f"{M}.backward:DqLog2Scale", number="2a",
           bug="dQ with a wrong scale (log2 e), dK/dV right",
           report="seed 001 (TE dQ wrong, dK/dV right); Triton tutorial's dq *= LN2",
           exposed_by="any case"),
    Mutant(name="mutant.dq_stale_delta", ref=f"{M}.backward:DqStaleDelta", number="2b",
           bug="dQ from stale softmax statistics (delta = 0), dK/dV right",
           report="seed 001; huggingface/picotron#37", exposed_by="any case"),
    Mutant(name="mutant.mqa_alibi_order", ref=f"{M}.forward:MqaAlibiOrder", number="3",
           bug="MQA + ALiBi bias rows in [sq*np] order where [np*sq] was built",
           report="seed 004 (bigcode Megatron-LM MQA non-flash path)",
           exposed_by="MQA with ALiBi"),
    Mutant(name="mutant.cp_stale_kv", ref=f"{M}.parallel:CpStaleKv", number="4",
           bug="CP ring backward reuses the first step's K/V at every step",
           report="huggingface/diffusers#14265", exposed_by="ring/zigzag CP",
           parallel=True),
    Mutant(name="mutant.kv_layout_swap", ref=f"{M}.backward:KvLayoutSwap", number="5",
           bug="K/V transposed (BSHD vs BHSD) in backward; silent only when H == S",
           report="huggingface/diffusers#14338 / #14341",
           exposed_by="any case (shape error); heads == seqlen for the silent form"),
    Mutant(name="mutant.tp_gqa_interleaved", ref=f"{M}.parallel:TpGqaInterleaved", number="6",
           bug="GQA K/V heads of a TP rank picked interleaved, not contiguous",
           report="alibaba/ChatLearn#277; HazyResearch/HipKittens#22",
           exposed_by="TP with >= 2 K/V heads per rank", parallel=True),
    Mutant(name="mutant.top_left_causal", ref=f"{M}.forward:TopLeftCausal", number="7",
           bug="causal mask aligned top-left where bottom-right was meant (Sq != Sk)",
           report="pytorch/pytorch#108108; Dao-AILab/flash-attention#517",
           exposed_by="causal with Sq != Sk, no ALiBi, no dropout"),
    Mutant(name="mutant.cp_lse_no_max", ref=f"{M}.parallel:CpLseNoMax", number="8",
           bug="CP log-sum-exp merge without the running max (overflows)",
           report="SHI-Labs/NATTEN#202", exposed_by="ring CP, fp16, large logits",
           parallel=True),
    Mutant(name="mutant.window_off_by_one", ref=f"{M}.forward:WindowOffByOne", number="9",
           bug="sliding window of W keys passed as W (inclusive bound: W - 1)",
           report="huggingface/transformers#39408; zml/zml#763", exposed_by="window masks"),
    Mutant(name="mutant.dropout_no_rescale", ref=f"{M}.backward:DropoutNoRescale", number="10",
           bug="backward drops dropout's 1/(1-p) rescale (mask hidden)",
           report="NVIDIA/apex#816", exposed_by="dropout"),
    Mutant(name="mutant.nondeterministic_dq", ref=f"{M}.backward:NondeterministicDq",
           number="11", bug="dQ accumulated in arrival order, presented as deterministic",
           report="Dao-AILab/flash-attention#414, #1766", exposed_by="any case"),
    Mutant(name="mutant.nan_tail_block", ref=f"{M}.backward:NanTailBlock", number="12",
           bug="NaN in backward when Sq is not a multiple of the 64-row tile",
           report="pytorch/pytorch#153799; NVIDIA/cudnn-frontend#160",
           exposed_by="odd sequence lengths"),
    Mutant(name="mutant.softcap_no_tanh_grad", ref=f"{M}.backward:SoftcapNoTanhGrad",
           number="extra", bug="softcap's tanh derivative missing from backward",
           report="Dao-AILab/flash-attention#1033, #2402", exposed_by="softcap"),
    Mutant(name="mutant.gqa_dkv_mean", ref=f"{M}.backward:GqaDkvMean", number="extra",
           bug="GQA/MQA dK/dV averaged over the head group instead of summed",
           report="marin-community/levanter#449", exposed_by="GQA or MQA"),
    Mutant(name="mutant.masked_row_nan", ref=f"{M}.forward:MaskedRowNan", number="extra",
           bug="NaN output for query rows that see no key",
           report="pytorch/pytorch#41508; NVIDIA-NeMo/Automodel#2826",
           exposed_by="causal with Sq > Sk, or windows"),
    Mutant(name="mutant.lse_log2", ref=f"{M}.parallel:LseLog2", number="extra",
           bug="log-sum-exp returned in base 2, merged as natural log under CP",
           report="sgl-project/sglang#35045; flashinfer-ai/flashinfer#4547",
           exposed_by="ring/zigzag CP (one device: the lse check)", parallel=True),
    Mutant(name="mutant.dropout_keep_p", ref=f"{M}.dropout:DropoutKeepP", number="13",
           bug="forward keeps with probability p instead of 1 - p, mask hidden",
           report="v-iashin/CS231n#8; google-research/electra#61",
           exposed_by="dropout (a hidden mask: recovered by probing, or statistics)",
           single=True),
    Mutant(name="mutant.dropout_renormalised", ref=f"{M}.dropout:DropoutRenormalised",
           number="14", bug="forward renormalises over the kept keys, mask hidden",
           report="facebookresearch/fairseq#351; huggingface/transformers#31468",
           exposed_by="dropout (a hidden mask: recovered by probing, or statistics)",
           single=True),
    Mutant(name="mutant.dropout_seed_ignored", ref=f"{M}.dropout:DropoutSeedIgnored",
           number="extra", bug="seeded hidden mask ignores the seed it is handed: the same "
           "mask at every call", report="facebookresearch/xformers#173 (the seed's address "
           "used as the seed); vllm-project/vllm#55009 (a seed from a data pointer)",
           exposed_by="dropout (a hidden mask: redrawn with another seed, or statistics)",
           dropout=True),
    Mutant(name="mutant.dropout_heads_share_mask", ref=f"{M}.dropout:DropoutHeadsShareMask",
           number="extra", bug="seeded hidden mask without the head in its RNG counter: every "
           "head draws the same mask", report="Dao-AILab/flash-attention#612 (the Philox offset "
           "carries batch and head); Dao-AILab/flash-attention#2439 (one Philox key for "
           "different elements)",
           exposed_by="dropout with >= 2 query heads (mask agreement between heads)",
           dropout=True),
    Mutant(name="mutant.dropout_batch_share_mask", ref=f"{M}.dropout:DropoutBatchShareMask",
           number="extra", bug="seeded hidden mask without the batch row in its RNG counter: "
           "every batch row (and document of a pack) draws the same mask",
           report="Dao-AILab/flash-attention#612 (the Philox offset carries batch and head)",
           exposed_by="dropout with batch >= 2 or a pack of >= 2 documents", dropout=True),
    Mutant(name="mutant.cp_dropout_local_offsets", ref=f"{M}.dropout:CpDropoutLocalOffsets",
           number="extra", bug="seeded hidden mask keyed by the call's local rows and keys: "
           "under CP every rank repeats rank 0's mask",
           report="NVIDIA/makani#40 (ring-aware dropout); awslabs/slapo#21 (each partition "
           "of attention dropout needs its own random stream)",
           exposed_by="CP with dropout (the ranks' masks against the seed's single-device "
           "replay)", parallel=True, dropout=True),
    Mutant(name="mutant.pv_accumulator_in_dtype", ref=f"{M}.fused:PvAccumulatorInDtype",
           number="15", bug="forward's P·V accumulator kept in bf16/fp16 across key blocks",
           report="Dao-AILab/flash-attention#2250 (FP8 accumulator not fp32: long-context "
                  "loss); philipturner/metal-flash-attention#13",
           exposed_by="long sequences (error grows with key blocks); the error trend",
           long=True),
    Mutant(name="mutant.dq_accumulator_in_dtype", ref=f"{M}.fused:DqAccumulatorInDtype",
           number="16", bug="dQ summed across key blocks in bf16/fp16 (dK/dV right)",
           report="seed 001 (TE #1615: dQ error growing with length)",
           exposed_by="long sequences; the error trend", long=True),
    Mutant(name="mutant.declared_dkv_in_dtype", ref=f"{M}.fused:DeclaredDkvInDtype",
           number="extra", bug="dK/dV added in the input dtype, a head group one head at a "
           "time, and declared computed in the input dtype (judged against naive: passes)",
           report="PyTorch 2.13's CPU flash backward, measured (docs/findings.md)",
           exposed_by="fp16/bf16 backward, GQA or MQA; a finding, not a failure"),
    Mutant(name="mutant.cu_seqlens_off_by_one", ref=f"{M}.packed:CuSeqlensOffByOne",
           number="17", bug="packed batch: every boundary inside cu_seqlens one token late",
           report="Dao-AILab/flash-attention#880; zhuzilin/ring-flash-attention#78",
           exposed_by="packed (seqlens_q) cases"),
    Mutant(name="mutant.cross_document_leak", ref=f"{M}.packed:CrossDocumentLeak",
           number="18", bug="packed batch attended as one sequence: queries see other documents",
           report="alex-hh/profam#495; huggingface/nanoVLM#204; mosaicml/llm-foundry#1464",
           exposed_by="packed (seqlens_q) cases"),
    Mutant(name="mutant.empty_document_nan", ref=f"{M}.packed:EmptyDocumentNan",
           number="extra", bug="packed batch: a document with queries and no keys outputs 0/0 "
           "(NaN) instead of zeros", report="pytorch/pytorch#41508 (the 0/0 of a row with no "
           "key), reached through a zero-length document",
           exposed_by="packed cases with a zero-length seqlens_kv entry"),
    Mutant(name="mutant.paged_wrong_sequence", ref=f"{M}.decode:PagedWrongSequence",
           number="19", bug="paged cache: block table row found by pages used, not the row "
           "stride (sequences read each other's pages)",
           report="tenstorrent/tt-metal#45193; Dao-AILab/flash-attention#785",
           exposed_by="paged decode, batch >= 2", decode=True),
    Mutant(name="mutant.page_boundary_off_by_one", ref=f"{M}.decode:PageBoundaryOffByOne",
           number="20", bug="paged cache: page of token t from (t + 1) // page_size (the "
           "last slot of each page read from the next page)",
           report="pegainfer-project/pegainfer#291; EricLBuehler/mistral.rs#552",
           exposed_by="paged decode", decode=True),
    Mutant(name="mutant.split_merge_no_max", ref=f"{M}.decode:SplitMergeNoMax", number="21",
           bug="split-KV decode merge: exp(lse) of each split without the max, in fp16/bf16",
           report="SHI-Labs/NATTEN#202; HKUSTDial/flash-sparse-attention#265",
           exposed_by="decode, fp16, large logits", decode=True),
    Mutant(name="mutant.cp_pack_positions", ref=f"{M}.parallel:CpPackPositions", number="22",
           bug="packed CP: each sequence's chunk placed by its row in the pack, not its "
           "position in the sequence",
           report="NVIDIA/TransformerEngine#1930; axolotl-ai-cloud/axolotl#3608",
           exposed_by="packed CP with seqlens_kv != seqlens_q, or dropout", parallel=True),
    Mutant(name="mutant.fp8_descale_v_twice", ref=f"{M}.fp8:Fp8DescaleVTwice", number="23",
           bug="fp8: O multiplied by descale_v twice (a descale applied a wrong number of "
           "times)", report="NVIDIA/cudnn-frontend#520 (fp8 SDPA drops descale_s/scale_s)",
           exposed_by="fp8 cases", fp8=True),
    Mutant(name="mutant.fp8_descale_k_by_query_head", ref=f"{M}.fp8:Fp8DescaleKByQueryHead",
           number="24", bug="fp8 per-head scaling: descale_k read with the query head's "
           "index, not its KV head's", report="ROCm/aiter#3894 (wrong flat index into the "
           "per-head KV scale buffer); sgl-project/sgl-kernel-xpu#252",
           exposed_by="fp8_scaling: head, GQA/MQA, heads of different scales (loud_heads)",
           fp8=True),
    Mutant(name="mutant.fp8_p_no_prescale", ref=f"{M}.fp8:Fp8PNoPrescale", number="25",
           bug="fp8: P cast to fp8 from (0, 1] without pre-scaling (diffuse softmax mass "
           "underflows in P·V, the normaliser keeps it)",
           report="flashinfer-ai/flashinfer#5020; ROCm/FlyDSL#1020",
           exposed_by="fp8 with an attention sink (inputs: sink), the longer the row the more",
           fp8=True),
    Mutant(name="mutant.fp8_descale_kv_swapped", ref=f"{M}.fp8:Fp8DescaleKvSwapped",
           number="extra", bug="fp8: descale_k and descale_v passed in each other's place",
           report="vllm-project/vllm#51363 (FA4 dropped the per-head Q/K/V descales; seen "
                  "only with descales that differ)",
           exposed_by="fp8 with K and V of different scales (inputs: kv_apart; also "
                      "large_logits, outliers)", fp8=True),
    Mutant(name="mutant.out_fp32", ref=f"{M}.returned:OutFp32", number="extra",
           bug="output returned in fp32 (the accumulator without the cast to the input dtype)",
           report="lucidrains/flash-attention-jax#13; facebookresearch/xformers#772",
           exposed_by="fp16/bf16 cases (the backend contract: its error)"),
    Mutant(name="mutant.gqa_dkv_expanded", ref=f"{M}.returned:GqaDkvExpanded", number="extra",
           bug="GQA/MQA dK/dV returned per query head, the sum over the group skipped",
           report="marin-community/levanter#449; NVIDIA/cudnn-frontend#493",
           exposed_by="GQA or MQA backward (the backend contract: its error)"),
    Mutant(name="mutant.lse_base2", ref=f"{M}.returned:LseBase2", number="extra",
           bug="forward's log-sum-exp returned in base 2",
           report="lightseekorg/tokenspeed#571; flashinfer-ai/flashinfer#2114",
           exposed_by="any case (the lse check), forward-only ones included"),
    Mutant(name="mutant.lse_no_scale", ref=f"{M}.returned:LseNoScale", number="extra",
           bug="log-sum-exp of the scores before the softmax scale",
           report="ROCm/aiter#3349; Dao-AILab/flash-attention#1884",
           exposed_by="any case (the lse check)"),
    Mutant(name="mutant.lse_rows_shifted", ref=f"{M}.returned:LseRowsShifted", number="extra",
           bug="each row's log-sum-exp written to the next row",
           report="AMD-Ecosystem/flashinfer#42; Dao-AILab/flash-attention#2842",
           exposed_by="any case (the lse check)"),
)

CONTROL = "mutant.base"
"""The correct recomputing backend most single-device mutants edit; it must pass."""
FUSED_CONTROL = "mutant.fused_base"
"""The correct fused-precision model the accumulation mutants edit; it must pass."""
HIDDEN_DROPOUT_CONTROL = "mutant.hidden_rng_dropout"
"""The correct hidden-mask dropout the two dropout mutants edit; it must pass."""
SEEDED_DROPOUT_CONTROL = "mutant.hidden_seed_dropout"
"""A correct kernel whose hidden mask is a function of the seed it is handed (a custom Triton
kernel's): it must pass single-device, packed and CP/TP dropout cases alike."""
CONTROLS = (CONTROL, FUSED_CONTROL, HIDDEN_DROPOUT_CONTROL, SEEDED_DROPOUT_CONTROL)
CAPTURED_ONLY = {"mutant.k_int8_unsmoothed": f"{M}.quantized:KInt8Unsmoothed"}
"""Mutants outside the selftest's catalogue: their bug shows only on captured activations (keys
with real structure), which no shipped synthetic sweep holds; the capture example
(``sweeps/captured_example.yaml``, docs/mutants.md) shows them caught."""
LONG_SEQLEN = 1024
"""Cases with at least this many keys are "long": only ``long`` mutants take them over."""

BACKENDS: dict[str, str] = {CONTROL: f"{M}.base:RecomputingNaive",
                            FUSED_CONTROL: f"{M}.fused:FusedModel",
                            HIDDEN_DROPOUT_CONTROL: f"{M}.dropout:HiddenTorchRngDropout",
                            SEEDED_DROPOUT_CONTROL: f"{M}.dropout:HiddenSeedDropout",
                            **CAPTURED_ONLY, **{m.name: m.ref for m in CATALOGUE}}


def by_name(name: str) -> Mutant:
    for mutant in CATALOGUE:
        if mutant.name == name:
            return mutant
    raise KeyError(f"no mutant {name!r}; known: {', '.join(m.name for m in CATALOGUE)}")
