"""A paged KV cache as inference servers keep one (vLLM, flash-attn's ``block_table``).

Legend: B = batch, Hkv = key-value heads, Sk = cache length, D / Dv = head dims, T = page_size
(tokens per page), N = pages per sequence = cdiv(Sk, T), P = pages in the pool.

``k_pages`` (P, T, Hkv, D) and ``v_pages`` (P, T, Hkv, Dv) are flash-attn's paged layout;
``block_table`` (B, N) int32 says that token t of sequence b lives in slot t % T of page
``block_table[b, t // T]``. Built from the logical (B, Hkv, Sk, D) cache that the fp64
reference reads, so a backend reading the pages must find exactly those keys.

What makes the layout a test, not just a copy:

* the table is a random permutation (seeded by the case): logically adjacent pages are almost
  never physically adjacent, so a kernel that runs on into the next physical page, or reads the
  row of another sequence, reads another sequence's keys;
* the table has ``SPARE_PAGES`` more columns than the sequences need (servers size it for the
  longest sequence allowed: flash-attn's ``max_num_blocks_per_seq``), pointing at pages no
  sequence owns; a kernel must step through rows by the table's stride, not by the pages a
  sequence uses;
* those spare pages and the slots past a sequence's last token hold random values, as a reused
  pool does, so a kernel that reads past the end of a sequence changes its output (a NaN there
  would also poison a correct kernel whose masked P = 0 meets V = NaN in P @ V).

Built once per case, before anything is timed (:mod:`attnbench.backends.masks`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SPARE_PAGES = 1
"""Pages per sequence in the pool that no sequence owns (a pool is never exactly full)."""


@dataclass(frozen=True)
class PagedCache:
    k_pages: torch.Tensor
    """(P, T, Hkv, D)"""
    v_pages: torch.Tensor
    """(P, T, Hkv, Dv)"""
    block_table: torch.Tensor
    """(B, N + SPARE_PAGES) int32: physical page of each logical page of each sequence."""
    page_size: int
    seqlen_kv: int
    """Tokens in each sequence's cache."""


def pages_per_sequence(seqlen_kv: int, page_size: int) -> int:
    return -(-seqlen_kv // page_size)


def build_paged_cache(k: torch.Tensor, v: torch.Tensor, page_size: int, seed: int) -> PagedCache:
    """The pages and block table holding k (B, Hkv, Sk, D) and v (B, Hkv, Sk, Dv)."""
    batch, heads_kv, seqlen_kv, _ = k.shape
    pages = pages_per_sequence(seqlen_kv, page_size)
    pool = batch * (pages + SPARE_PAGES)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    table = torch.randperm(pool, generator=gen).view(batch, pages + SPARE_PAGES).to(torch.int32)
    used = table[:, :pages]
    noise = torch.Generator(device=k.device).manual_seed(seed + 1)

    def paged(x: torch.Tensor) -> torch.Tensor:
        dim = x.shape[-1]
        out = _pool_with_spare_noise(x, pool, page_size, used, noise)
        padded = torch.empty((batch, pages * page_size, heads_kv, dim), dtype=x.dtype,
                             device=x.device)
        padded[:, :seqlen_kv] = x.transpose(1, 2)                      # (B, Sk, Hkv, dim)
        padded[:, seqlen_kv:] = _noise(padded[:, seqlen_kv:].shape, x, noise)
        out[used.flatten().long().to(x.device)] = padded.view(batch * pages, page_size,
                                                               heads_kv, dim)
        return out

    return PagedCache(k_pages=paged(k), v_pages=paged(v), block_table=table.to(k.device),
                      page_size=page_size, seqlen_kv=seqlen_kv)


def _noise(shape, like: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=gen, device=like.device,
                       dtype=torch.float32).to(like.dtype)


def _pool_with_spare_noise(x: torch.Tensor, pool: int, page_size: int, table: torch.Tensor,
                           gen: torch.Generator) -> torch.Tensor:
    """(P, T, Hkv, dim): random values in the pages no sequence owns, zeros in the others
    (overwritten next)."""
    out = torch.zeros((pool, page_size, x.shape[1], x.shape[-1]), dtype=x.dtype, device=x.device)
    owned = torch.zeros(pool, dtype=torch.bool)
    owned[table.flatten().long()] = True
    spare = (~owned).nonzero().flatten().to(x.device)
    out[spare] = _noise(out[spare].shape, x, gen)
    return out


def gather_kv(cache: PagedCache) -> tuple[torch.Tensor, torch.Tensor]:
    """The logical cache back from the pages, token by token as a paged kernel addresses it:
    k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv)."""
    table = cache.block_table.long().flatten()
    batch = cache.block_table.shape[0]
    pos = torch.arange(cache.seqlen_kv, device=table.device)
    row = torch.arange(batch, device=table.device)[:, None] * cache.block_table.stride(0)
    page = table[row + pos // cache.page_size]                        # (B, Sk)
    slot = (pos % cache.page_size).expand_as(page)
    return (cache.k_pages[page, slot].transpose(1, 2),                 # (B, Hkv, Sk, D)
            cache.v_pages[page, slot].transpose(1, 2))


@dataclass(frozen=True)
class DecodeCache:
    """The KV cache of a decode call as a backend reads it, built once per case."""

    k: torch.Tensor
    """(B, Hkv, Sk, D) contiguous, or the page pool (P, T, Hkv, D)."""
    v: torch.Tensor
    block_table: "torch.Tensor | None"
    """(B, N) int32 when paged."""
    seqlens: torch.Tensor
    """(B,) int32 on the device: keys in each sequence's cache."""
    max_seqlen: int
    page_size: int


def decode_cache(spec, k: torch.Tensor, v: torch.Tensor) -> DecodeCache:
    """The cache of ``spec``'s decode call: paged (``spec.page_size``, the block table seeded by
    the case) or the contiguous k (B, Hkv, Sk, D), v as they are."""
    batch, _, seqlen_kv, _ = k.shape
    seqlens = torch.full((batch,), seqlen_kv, dtype=torch.int32, device=k.device)
    if not spec.page_size:
        return DecodeCache(k, v, None, seqlens, seqlen_kv, 0)
    paged = build_paged_cache(k, v, spec.page_size, seed=spec.dropout_seed)
    return DecodeCache(paged.k_pages, paged.v_pages, paged.block_table, seqlens, seqlen_kv,
                       spec.page_size)
