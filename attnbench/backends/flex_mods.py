"""The case's attention as FlexAttention takes it: a ``score_mod``, a ``mask_mod`` and a block mask.

Legend: B = batch, Hq = query heads, Sq / Sk = this call's query / key lengths, Tq / Tk = tokens of
a pack, N = documents of a pack.

FlexAttention (``torch.nn.attention.flex_attention``) calls ``score_mod(score, b, h, q_idx,
kv_idx)`` on every scaled score and keeps the pairs ``mask_mod(b, h, q_idx, kv_idx)`` is true for;
indices are this call's. The conventions of :mod:`attnbench.problem.attn_spec` become:

* softcap, then ALiBi, in ``score_mod`` (scores are fp32 there); ALiBi distances and slopes are
  global: query i of the call sits at key ``i + diag`` of the call, ``diag = q_start +
  diagonal_offset - kv_start`` (bottom-right: what flash-attn and FlexAttention's own causal
  examples call ``q_idx + Sk - Sq``), head h is global head ``head_start + h``;
* the window (causal is ``right = 0``) in ``mask_mod``, relative to the same diagonal;
* a pack: every token's document and its position in that document are tensors (built once),
  ``mask_mod`` keeps a pair only inside one document, and the diagonal is that document's
  ``Sk_b - Sq_b`` -- attention-gym's ``generate_doc_mask_mod``, with our alignment.

What the mods capture is tensors (slopes, document ids) or ints: dynamo lifts the tensors as
graph inputs and guards the ints, so a case with the same shapes and features reuses the compiled
kernel. Torch only; no FlexAttention import here (it is the backend's, :mod:`.flex`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from attnbench.problem.attn_spec import AttnSpec


@dataclass(frozen=True)
class Mods:
    """One call's modifications; None where the call needs none."""

    score_mod: Optional[Callable]
    mask_mod: Optional[Callable]
    constants: tuple = ()
    """The Python numbers the mods capture: dynamo guards them, so a new value compiles anew
    (part of the backend's key for "compiled already")."""


def call_diagonal(spec: AttnSpec) -> int:
    """Key position (within this call) of this call's query 0: bottom-right, global offsets."""
    return spec.q_start + spec.diagonal_offset - spec.kv_start


def window_mask(left: int, right: int, rel: torch.Tensor) -> torch.Tensor:
    """Whether a key ``rel`` positions right of its query's diagonal is visible (-1: unbounded;
    at least one bound is set by the caller)."""
    if right >= 0 and left >= 0:
        return (rel <= right) & (rel >= -left)
    return rel <= right if right >= 0 else rel >= -left


def dense_mods(spec: AttnSpec, heads_q: int, device: torch.device) -> Mods:
    """The mods of a dense call (B, Hq, Sq, D) x (B, Hkv, Sk, D)."""
    diag = call_diagonal(spec)
    left, right = spec.window_left, spec.window_right
    mask_mod = None
    if spec.is_masked:
        def mask_mod(b, h, q_idx, kv_idx):
            return window_mask(left, right, kv_idx - (q_idx + diag))

    offsets = _Offsets(diag=diag)
    return Mods(score_mod=_score_mod(spec, heads_q, device, offsets), mask_mod=mask_mod,
                constants=(diag, left, right, spec.softcap))


@dataclass(frozen=True)
class _Offsets:
    """Where a query sits relative to a key: a constant diagonal (dense), or per token (pack)."""

    diag: int = 0
    doc_q: Optional[torch.Tensor] = None
    """(Tq,) int32: each query's document."""
    pos_q: Optional[torch.Tensor] = None
    """(Tq,) int32: each query's key position on its document's diagonal (its position in the
    document plus the document's ``Sk_b - Sq_b``)."""
    doc_k: Optional[torch.Tensor] = None
    pos_k: Optional[torch.Tensor] = None
    """(Tk,) int32: each key's position in its document."""


def _score_mod(spec: AttnSpec, heads_q: int, device: torch.device,
               offsets: _Offsets) -> Optional[Callable]:
    cap = float(spec.softcap)
    slopes = None
    if spec.alibi_slopes is not None:
        slopes = torch.tensor(spec.alibi_slopes[spec.head_start:spec.head_start + heads_q],
                              dtype=torch.float32, device=device)
    if cap <= 0 and slopes is None:
        return None

    def distance(q_idx, kv_idx):
        if offsets.pos_q is None:
            return (q_idx + offsets.diag - kv_idx).abs()
        return (offsets.pos_q[q_idx] - offsets.pos_k[kv_idx]).abs()

    def score_mod(score, b, h, q_idx, kv_idx):
        if cap > 0:
            score = cap * torch.tanh(score / cap)
        if slopes is not None:
            score = score - slopes[h] * distance(q_idx, kv_idx).to(torch.float32)
        return score

    return score_mod


def packed_mods(spec: AttnSpec, heads_q: int, device: torch.device) -> Mods:
    """The mods of a packed call (1, Hq, Tq, D) x (1, Hkv, Tk, D) at ``spec.cu_seqlens_q/kv``:
    no pair across documents, each document aligned bottom-right by its own lengths."""
    offsets = _document_offsets(spec, device)
    left, right = spec.window_left, spec.window_right
    masked = spec.is_masked

    def mask_mod(b, h, q_idx, kv_idx):
        same = offsets.doc_q[q_idx] == offsets.doc_k[kv_idx]
        if not masked:
            return same
        return same & window_mask(left, right, offsets.pos_k[kv_idx] - offsets.pos_q[q_idx])

    return Mods(score_mod=_score_mod(spec, heads_q, device, offsets), mask_mod=mask_mod,
                constants=(left, right, spec.softcap))


def _document_offsets(spec: AttnSpec, device: torch.device) -> _Offsets:
    def per_token(cu: tuple[int, ...]):
        lengths = torch.tensor([b - a for a, b in zip(cu, cu[1:])], device=device)
        docs = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)
        starts = torch.tensor(cu[:-1], device=device)
        return docs, torch.arange(cu[-1], device=device) - starts[docs], lengths

    doc_q, pos_q, len_q = per_token(spec.cu_seqlens_q)
    doc_k, pos_k, len_k = per_token(spec.cu_seqlens_kv)
    diag = len_k - len_q  # per document: its own bottom-right corner
    as_int = torch.int32
    return _Offsets(doc_q=doc_q.to(as_int), pos_q=(pos_q + diag[doc_q]).to(as_int),
                    doc_k=doc_k.to(as_int), pos_k=pos_k.to(as_int))


def call_mods(spec: AttnSpec, heads_q: int, device: torch.device) -> Mods:
    """The mods of this call, dense or packed."""
    return packed_mods(spec, heads_q, device) if spec.is_packed else \
        dense_mods(spec, heads_q, device)
