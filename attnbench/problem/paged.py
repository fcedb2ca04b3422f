"""The KV cache of a decode case as inference servers keep one: paged (vLLM, flash-attn's
``block_table``) or contiguous, with one length per sequence.

Legend: B = sequences, Hq / Hkv = query / key-value heads, Sq = new tokens per sequence,
L_b = keys in sequence b's cache, Smax = max L_b, D / Dv = head dims, T = page_size (tokens
per page), N = table width, P = pages in the pool.

The harness hands a decode case's K/V over as the fp64 reference reads them: dense
(B, Hkv, Sk, D) with one length, or packed (1, Hkv, sum L_b, D) with ``seqlens_kv``
(:mod:`attnbench.problem.packing`). What a decode kernel reads is built from that, once per case,
before anything is timed:

* paged: ``k_pages`` (P, T, Hkv, D), ``v_pages`` (P, T, Hkv, Dv) -- flash-attn's layout -- and
  ``block_table`` (B, N) int32: token t of sequence b is in slot t % T of page
  ``block_table[b, t // T]``;
* contiguous: (B, Hkv, Smax, D), each sequence's keys first, random values after them.

What makes the layout a test, not just a copy:

* the table is a random permutation (seeded by the case): logically adjacent pages are almost
  never physically adjacent, so a kernel that runs on into the next physical page, or reads
  the row of another sequence, reads another sequence's keys;
* the table has ``SPARE_PAGES`` more columns than the longest sequence needs (servers size it
  for the longest sequence allowed: flash-attn's ``max_num_blocks_per_seq``), and a shorter
  sequence's unused columns point at pages no sequence owns: a kernel must step through rows
  by the table's stride, not by the pages a sequence uses;
* unowned pages, the slots after a sequence's last token and a contiguous cache's padding hold
  random values, as a reused pool does, so a kernel that reads past the end of a sequence
  changes its output (a NaN there would also poison a correct kernel whose masked P = 0 meets
  V = NaN in P @ V).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

SPARE_PAGES = 1
"""Table columns (and pool pages per sequence) beyond what the longest sequence needs."""


@dataclass(frozen=True)
class PagedCache:
    k_pages: torch.Tensor
    """(P, T, Hkv, D)"""
    v_pages: torch.Tensor
    """(P, T, Hkv, Dv)"""
    block_table: torch.Tensor
    """(B, N) int32, N = cdiv(Smax, T) + SPARE_PAGES: physical page of each logical page."""
    page_size: int
    seqlens: tuple[int, ...]
    """Keys in each sequence's cache."""
    packed: bool
    """Whether the logical cache is packed (1, Hkv, sum L_b, *) rather than (B, Hkv, Sk, *)."""

    @property
    def max_seqlen(self) -> int:
        return max(self.seqlens)


def pages_per_sequence(seqlen_kv: int, page_size: int) -> int:
    return -(-seqlen_kv // page_size)


def sequence_tokens(x: torch.Tensor, cu_seqlens: tuple[int, ...]) -> list[torch.Tensor]:
    """Each sequence's keys (Hkv, L_b, dim): of a packed x (1, Hkv, sum L_b, dim) cut at
    ``cu_seqlens``, or the rows of a dense x (B, Hkv, Sk, dim)."""
    if cu_seqlens:
        return [x[0, :, a:b] for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:])]
    return list(x)


def build_paged_cache(k: torch.Tensor, v: torch.Tensor, page_size: int, seed: int,
                      cu_seqlens: tuple[int, ...] = ()) -> PagedCache:
    """The pages and block table holding the logical cache k, v (dense, or packed at
    ``cu_seqlens``)."""
    lengths = [t.shape[1] for t in sequence_tokens(k, cu_seqlens)]
    batch, heads_kv = len(lengths), k.shape[1]
    used = [pages_per_sequence(n, page_size) for n in lengths]
    width = max(used) + SPARE_PAGES
    gen = torch.Generator(device="cpu").manual_seed(seed)
    table = torch.randperm(batch * width, generator=gen).view(batch, width).to(torch.int32)
    owned = torch.cat([table[b, :n] for b, n in enumerate(used)]).long()
    noise = torch.Generator(device=k.device).manual_seed(seed + 1)

    def paged(x: torch.Tensor) -> torch.Tensor:
        dim = x.shape[-1]
        pool = _noise((batch * width, page_size, heads_kv, dim), x, noise)
        pool[owned.to(x.device)] = torch.cat([
            _padded(tokens.transpose(0, 1), n * page_size, noise)   # (n * T, Hkv, dim)
            for tokens, n in zip(sequence_tokens(x, cu_seqlens), used)
        ]).view(-1, page_size, heads_kv, dim)
        return pool

    return PagedCache(k_pages=paged(k), v_pages=paged(v), block_table=table.to(k.device),
                      page_size=page_size, seqlens=tuple(lengths), packed=bool(cu_seqlens))


def _noise(shape, like: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=gen, device=like.device,
                       dtype=torch.float32).to(like.dtype)


def _padded(tokens: torch.Tensor, length: int, gen: torch.Generator) -> torch.Tensor:
    """tokens (L, ...) followed by random values up to ``length`` rows."""
    tail = _noise((length - tokens.shape[0], *tokens.shape[1:]), tokens, gen)
    return torch.cat([tokens, tail])


def gather_kv(cache: PagedCache) -> tuple[torch.Tensor, torch.Tensor]:
    """The logical cache back from the pages, token by token as a paged kernel addresses it:
    dense k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv), or packed (1, Hkv, sum L_b, *)."""
    table = cache.block_table.long().flatten()
    device = table.device
    lengths = torch.tensor(cache.seqlens, device=device)
    starts = torch.cumsum(lengths, 0) - lengths
    seq = torch.repeat_interleave(torch.arange(len(cache.seqlens), device=device), lengths)
    pos = torch.arange(int(lengths.sum()), device=device) - starts[seq]  # within its sequence
    row = seq * cache.block_table.stride(0)
    page = table[row + pos // cache.page_size]                        # (sum L_b,)
    slot = pos % cache.page_size

    def logical(pages: torch.Tensor) -> torch.Tensor:
        tokens = pages[page, slot]                                     # (sum L_b, Hkv, dim)
        if cache.packed:
            return tokens.transpose(0, 1).unsqueeze(0)
        return tokens.view(len(cache.seqlens), -1, *tokens.shape[1:]).transpose(1, 2)

    return logical(cache.k_pages), logical(cache.v_pages)


# -- what decode kernels take -------------------------------------------------------------------


@dataclass(frozen=True)
class DecodeCache:
    """The KV cache of a decode call as a kernel reads it, built once per case."""

    k: torch.Tensor
    """(B, Hkv, Smax, D) contiguous, or the page pool (P, T, Hkv, D)."""
    v: torch.Tensor
    block_table: Optional[torch.Tensor]
    """(B, N) int32 when paged."""
    seqlens: torch.Tensor
    """(B,) int32 on the device: keys in each sequence's cache."""
    max_seqlen: int
    page_size: int


def decode_cache(spec, k: torch.Tensor, v: torch.Tensor) -> DecodeCache:
    """The cache of ``spec``'s decode call: paged (``spec.page_size``, the table seeded by the
    case), or contiguous (B, Hkv, Smax, *) -- dense k, v as they are, a packed one padded."""
    cu = spec.cu_seqlens_kv
    lengths = [t.shape[1] for t in sequence_tokens(k, cu)]
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=k.device)
    if spec.page_size:
        paged = build_paged_cache(k, v, spec.page_size, seed=spec.dropout_seed, cu_seqlens=cu)
        return DecodeCache(paged.k_pages, paged.v_pages, paged.block_table, seqlens,
                           max(lengths), spec.page_size)
    if cu:
        noise = torch.Generator(device=k.device).manual_seed(spec.dropout_seed + 1)

        def padded(x):
            return torch.stack([_padded(t.transpose(0, 1), max(lengths), noise).transpose(0, 1)
                                for t in sequence_tokens(x, cu)])
        k, v = padded(k), padded(v)
    return DecodeCache(k, v, None, seqlens, max(lengths), 0)


def decode_queries(q: torch.Tensor, spec) -> torch.Tensor:
    """q as (B, Hq, Sq, D): a packed decode case's (1, Hq, B * Sq, D) viewed per sequence
    (every sequence has the same Sq new tokens; no copy)."""
    if not spec.cu_seqlens_q:
        return q
    batch = len(spec.cu_seqlens_q) - 1
    heads_q, total, dim = q.shape[1:]
    return q[0].view(heads_q, batch, total // batch, dim).transpose(0, 1)


def packed_like(out: torch.Tensor, lse: torch.Tensor, spec):
    """out (B, Hq, Sq, Dv), lse (B, Hq, Sq) back in the layout of ``spec``'s queries."""
    if not spec.cu_seqlens_q:
        return out, lse
    batch, heads_q, sq, dv = out.shape
    return (out.transpose(0, 1).reshape(1, heads_q, batch * sq, dv),
            lse.transpose(0, 1).reshape(1, heads_q, batch * sq))
