"""Token alignment for the grouped GEMMs: (token, slot) pairs sorted by expert, each expert padded to the tile.

The routing gives each token K expert ids; pair i = token * K + slot goes
to expert ids.flat[i]. The grouped GEMMs want each expert's pairs in
consecutive rows, each expert's run padded to a multiple of the GEMM's row
tile BM, so that every BM-row block belongs to one expert (vLLM's
moe_align_block_size). The outputs:

    sorted_ids[r]     the pair in row r (pairs of one expert in pair order), or numel (padding)
    block_expert[b]   the expert of rows b*BM .. b*BM+BM-1 (-1 past the last block in use)
    offsets[e]        the first row of expert e; offsets[E] is the number of rows in use

An expert with no pairs gets no rows and no blocks, so it costs nothing.

It is a counting sort with no atomics, so the order is deterministic, in
three steps that each read every (token, slot) pair or histogram entry once:

    count    each routing chunk's histogram of expert ids (a row of
             `chunk_counts`: the routing kernel writes it; for ids from
             elsewhere `count_kernel` does, one more launch)
    prefix   `prefix_kernel`: chunk_starts[q, e] = pairs of expert e in the
             chunks before q, an exclusive scan down each column, EB experts
             per program and CB chunks per step
    scatter  `align_kernel`, a program per chunk: pair i of expert e goes to
             row offsets[e] + chunk_starts[chunk, e] + (pairs of e before i
             in this chunk), the experts' cursors for this chunk plus a rank
             among at most 128 pairs; program p also writes the padding rows
             and block experts of experts p, p + P, ...

So the launches read O(P * E + T * K) values for P chunks (the histograms
once in the prefix, once more row by row in the scatter), where reading
every earlier chunk's histogram in the scatter would cost P^2 / 2 rows (8 GB
at 64k DeepSeek-V3 tokens in chunks of 16). With one chunk (decode) there is
nothing to scan: the prefix launch is skipped and the scatter reads no
chunk_starts.
"""

from __future__ import annotations

from typing import Optional

import torch

import tessera
import tessera.torch

from .common import check_device, kernel_arg
from .routing import tokens_per_program

BLOCK_LANES = 16         # blocks whose expert (and unused rows) one store writes
PREFIX_EXPERTS = 32      # EB: experts (columns of chunk_counts) one prefix program scans
PREFIX_LANES = 2048      # CB * EB: the chunk_counts tile one prefix step loads


@tessera.kernel
def count_kernel(ids_ptr, counts_ptr, chunk_counts_ptr, numel, E, CHUNK: tessera.constexpr,
                 CHUNK_PAD: tessera.constexpr, E_PAD: tessera.constexpr):
    """Each chunk's histogram of expert ids (a row of chunk_counts), and the totals (atomically)."""
    count_chunk(ids_ptr, counts_ptr, chunk_counts_ptr, numel, E, tessera.program_id(0), CHUNK, CHUNK_PAD, E_PAD)


@tessera.func
def count_chunk(ids_ptr, counts_ptr, chunk_counts_ptr, numel, E, chunk, CHUNK, CHUNK_PAD, E_PAD):
    """Chunk `chunk`'s histogram of expert ids into its row of chunk_counts, and atomically into counts."""
    lanes = tessera.arange(0, CHUNK_PAD)
    pairs = chunk * CHUNK + lanes
    real = (lanes < CHUNK) & (pairs < numel)
    hist = tessera.histogram(tessera.load(ids_ptr + pairs, mask=real), E_PAD, mask=real)
    experts = tessera.arange(0, E_PAD)
    tessera.store(chunk_counts_ptr + chunk * E + experts, hist, mask=experts < E)
    tessera.atomic_add(counts_ptr + experts, hist, mask=experts < E)


@tessera.kernel
def prefix_kernel(chunk_counts_ptr, chunk_starts_ptr, chunks, E, CB: tessera.constexpr, EB: tessera.constexpr):
    """chunk_starts[q, e] = sum of chunk_counts[q', e] over q' < q, for EB experts: a CB x EB tile per step, its
    column sums carried to the next."""
    prefix_slice(chunk_counts_ptr, chunk_starts_ptr, chunks, E, tessera.program_id(0), CB, EB)


@tessera.func
def prefix_slice(chunk_counts_ptr, chunk_starts_ptr, chunks, E, part, CB, EB):
    """The exclusive scan of experts part * EB .. part * EB + EB - 1 down the chunks (see prefix_kernel)."""
    counts = tessera.view(chunk_counts_ptr, (chunks, E))
    starts = tessera.view(chunk_starts_ptr, (chunks, E))
    carry = tessera.zeros((EB,), dtype=tessera.i32)
    for q in range(0, tessera.cdiv(chunks, CB)):
        tile = counts.block((CB, EB), (q, part)).load()
        starts.block((CB, EB), (q, part)).store(tessera.cumsum(tile, 0) - tile + carry[None, :])
        carry += tessera.sum(tile, 0)


@tessera.func
def pick(values, lanes, e):
    """values[e] of a 1-D tile, as a scalar."""
    return tessera.sum(tessera.where(lanes == e, values, 0))


@tessera.func
def pad_experts(sorted_ptr, block_expert_ptr, starts, counts, padded, experts, numel, E, BM, part, parts):
    """For experts part, part + parts, ...: the padding rows after its pairs, and the expert of each of its
    blocks."""
    rows = tessera.arange(0, BM)
    blocks = tessera.arange(0, BLOCK_LANES)
    for e in range(part, E, parts):
        start, count, size = pick(starts, experts, e), pick(counts, experts, e), pick(padded, experts, e)
        tessera.store(sorted_ptr + start + count + rows, numel, mask=count + rows < size)
        for b in range(start // BM, (start + size) // BM, BLOCK_LANES):
            tessera.store(block_expert_ptr + b + blocks, e, mask=b + blocks < (start + size) // BM)


@tessera.func
def fill_unused(sorted_ptr, block_expert_ptr, first, numel, max_rows, BM, part, parts):
    """Blocks `first` .. past the rows in use: expert -1 and padding rows, BLOCK_LANES blocks per step, the
    steps dealt out over `parts` (part: this one's share)."""
    blocks = tessera.arange(0, BLOCK_LANES)
    rows = tessera.arange(0, BM)
    max_blocks = (max_rows + BM - 1) // BM
    step = parts * BLOCK_LANES
    for b in range(first + part * BLOCK_LANES, max_blocks, step):
        tessera.store(block_expert_ptr + b + blocks, -1, mask=b + blocks < max_blocks)
        unused = (b + blocks)[:, None] * BM + rows[None, :]
        tessera.store(sorted_ptr + unused, numel, mask=unused < max_rows)


@tessera.kernel
def align_kernel(ids_ptr, counts_ptr, chunk_starts_ptr, sorted_ptr, block_expert_ptr, offsets_ptr, numel, E,
                 max_rows, BM: tessera.constexpr, CHUNK: tessera.constexpr, CHUNK_PAD: tessera.constexpr,
                 E_PAD: tessera.constexpr):
    scatter_chunk(ids_ptr, counts_ptr, chunk_starts_ptr, sorted_ptr, block_expert_ptr, offsets_ptr, numel, E,
                  max_rows, tessera.program_id(0), tessera.num_programs(0), BM, CHUNK, CHUNK_PAD, E_PAD)


@tessera.func
def scatter_chunk(ids_ptr, counts_ptr, chunk_starts_ptr, sorted_ptr, block_expert_ptr, offsets_ptr, numel, E,
                  max_rows, chunk, chunks, BM, CHUNK, CHUNK_PAD, E_PAD):
    """Chunk `chunk` of `chunks` of the alignment: its pairs' rows of sorted_ids (returned, one per lane of
    CHUNK_PAD), and its share of the padding rows, block experts and offsets."""
    experts = tessera.arange(0, E_PAD)
    counts = tessera.load(counts_ptr + experts, mask=experts < E)
    padded = (counts + BM - 1) // BM * BM
    starts = tessera.cumsum(padded, 0) - padded
    used = tessera.sum(padded)

    earlier = tessera.load(chunk_starts_ptr + chunk * E + experts, mask=(experts < E) & (chunk > 0))  # 0 at chunk 0
    lanes = tessera.arange(0, CHUNK_PAD)
    pairs = chunk * CHUNK + lanes
    real = (lanes < CHUNK) & (pairs < numel)
    e = tessera.load(ids_ptr + pairs, mask=real)
    same_before = (e[:, None] == e[None, :]) & (lanes[None, :] < lanes[:, None]) & real[None, :]
    rows = tessera.gather(starts + earlier, e, 0) + tessera.sum(same_before.to(tessera.i32), 1)
    tessera.store(sorted_ptr + rows, pairs, mask=real)

    pad_experts(sorted_ptr, block_expert_ptr, starts, counts, padded, experts, numel, E, BM, chunk, chunks)
    fill_unused(sorted_ptr, block_expert_ptr, used // BM, numel, max_rows, BM, chunk, chunks)
    if chunk == 0:
        tessera.store(offsets_ptr + experts, starts, mask=experts < E)
        tessera.store(offsets_ptr + E, used)
    return rows


def max_rows(numel: int, num_experts: int, block_m: int) -> int:
    """Rows the aligned order can need: every pair, plus up to BM - 1 padding rows per expert in use."""
    return numel + min(numel, num_experts) * (block_m - 1)


def prefix_chunks(chunks: int, experts_per_program: int) -> int:
    """CB: chunks one prefix step scans, a power of two of at most PREFIX_LANES / EB (fewer for few chunks,
    so that decode-sized batches load no empty tile)."""
    return min(tessera.next_power_of_2(chunks), PREFIX_LANES // experts_per_program)


def _check(ids: torch.Tensor, num_experts: int, block_m: int, counts, chunk_counts) -> None:
    if ids.dim() != 2 or ids.dtype != torch.int32:
        raise ValueError(f"tessera::moe_align: ids must be int32 [tokens, top_k] (moe_route's expert ids), got "
                         f"{ids.dtype} {tuple(ids.shape)}; convert with .to(torch.int32)")
    if block_m < 1 or block_m & (block_m - 1):
        raise ValueError(f"tessera::moe_align: block_m must be a power of two, got {block_m}")
    if (counts is None) != (chunk_counts is None):
        raise ValueError("tessera::moe_align: pass counts and chunk_counts together (both from moe_route), or "
                         "neither")
    if chunk_counts is not None:
        chunks = tessera.cdiv(ids.shape[0], tokens_per_program(num_experts, ids.shape[1]))
        if tuple(chunk_counts.shape) != (chunks, num_experts) or tuple(counts.shape) != (num_experts,):
            raise ValueError(f"tessera::moe_align: counts must be [{num_experts}] and chunk_counts "
                             f"[{chunks}, {num_experts}] (moe_route's), got {tuple(counts.shape)} and "
                             f"{tuple(chunk_counts.shape)}")
    check_device("moe_align", ids, counts=counts, chunk_counts=chunk_counts)


def _align(ids: torch.Tensor, num_experts: int, block_m: int, counts: Optional[torch.Tensor] = None,
           chunk_counts: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The implementation of `torch.ops.tessera.moe_align`: see `align`."""
    _check(ids, num_experts, block_m, counts, chunk_counts)
    T, K = ids.shape
    numel, E, device = ids.numel(), num_experts, ids.device
    rows = max_rows(numel, E, block_m)
    sorted_ids = torch.empty(rows, dtype=torch.int32, device=device)
    block_expert = torch.empty(tessera.cdiv(rows, block_m), dtype=torch.int32, device=device)
    offsets = torch.zeros(E + 1, dtype=torch.int32, device=device)
    if numel == 0:
        return sorted_ids, block_expert, offsets
    BT = tokens_per_program(E, K)
    chunk, chunks = BT * K, tessera.cdiv(T, BT)
    sizes = dict(CHUNK=chunk, CHUNK_PAD=tessera.next_power_of_2(chunk), E_PAD=tessera.next_power_of_2(E))
    ids = ids.contiguous()
    if counts is None:
        counts = torch.zeros(E, dtype=torch.int32, device=device)
        chunk_counts = torch.empty((chunks, E), dtype=torch.int32, device=device)
        count_kernel[(chunks,)](kernel_arg(ids), kernel_arg(counts), kernel_arg(chunk_counts), numel, E, **sizes)
    chunk_starts = chunk_counts                 # one chunk: chunk_starts is never read (its row 0 is zeros)
    if chunks > 1:
        chunk_starts = torch.empty((chunks, E), dtype=torch.int32, device=device)
        EB = min(PREFIX_EXPERTS, sizes["E_PAD"])
        prefix_kernel[(tessera.cdiv(E, EB),)](kernel_arg(chunk_counts.contiguous()), kernel_arg(chunk_starts),
                                              chunks, E, CB=prefix_chunks(chunks, EB), EB=EB)
    args = (ids, counts.contiguous(), chunk_starts.contiguous(), sorted_ids, block_expert, offsets)
    align_kernel[(chunks,)](*(kernel_arg(t) for t in args), numel, E, rows, BM=block_m, **sizes)
    return sorted_ids, block_expert, offsets


align_op = torch.library.custom_op("tessera::moe_align", _align, mutates_args=())


@align_op.register_fake
def _align_fake(ids, num_experts, block_m, counts=None, chunk_counts=None):
    _check(ids, num_experts, block_m, counts, chunk_counts)
    rows = max_rows(ids.numel(), num_experts, block_m)
    return (ids.new_empty((rows,)), ids.new_empty((tessera.cdiv(rows, block_m),)),
            ids.new_empty((num_experts + 1,)))


def align(ids: torch.Tensor, num_experts: int, block_m: int, counts: Optional[torch.Tensor] = None,
          chunk_counts: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort the (token, slot) pairs of `ids` ([T, K] int32 expert ids) by expert, padding each expert's run
    to a multiple of `block_m` rows (moe_align_block_size).

    Returns (sorted_ids, block_expert, offsets), int32: sorted_ids[r] is the
    pair token * K + slot in row r, or T * K on padding rows; block_expert[b]
    the expert of rows b * block_m ... (-1 for blocks past the rows in use);
    offsets[e] the first row of expert e and offsets[num_experts] the rows
    in use. Pairs of one expert keep their order. `counts` and
    `chunk_counts` are `route`'s; without them one more launch counts.
    This is the op `torch.ops.tessera.moe_align`, called directly where
    nothing observes the dispatch (`tessera.torch.unobserved`).
    """
    op = _align if tessera.torch.unobserved(ids, counts, chunk_counts) else align_op
    return op(ids, num_experts, block_m, counts, chunk_counts)
