"""tessera.kernels_lib.moe.align: the expert-sorted, tile-padded token order, in launches linear in the batch.

Specification:

* over many routing chunks (so that the prefix scan runs, over several programs of experts and, at a small
  tile, several steps), `align` gives moe_align_block_size's order: each expert's pairs in pair order, padded
  to the tile, an expert per block, nothing for an expert without tokens; with k = 1 and 8, odd numbers of
  tokens and experts, from route's counts or counting on its own; opcheck passes over several chunks;
* `prefix_kernel` is the exclusive scan of the chunk histograms down each expert's column, for tiles that do
  not divide the chunks or the experts;
* the scatter loads one row of chunk starts per program, before its loops: no loop over earlier chunks;
* counting, the prefix and the scatter compute on the SIMT simulator what the interpreter computes;
* the three kernels compile with no register spills for sm_80, sm_90a and gfx942 at the benchmark's expert
  counts.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import moe_reference as ref
from amd_spills import amd_spills
from tessera.backends.simt import run_threads
from tessera.kernels_lib.moe import align, route
from tessera.kernels_lib.moe.align import PREFIX_EXPERTS, PREFIX_LANES, align_kernel, align_op, count_kernel, \
    max_rows, prefix_chunks, prefix_kernel
from tessera.kernels_lib.moe.routing import tokens_per_program
from tessera.ir.printer import print_module
from tessera.passes.thread_passes import lower


def _random_ids(tokens, experts, top_k, seed, empty=()):
    """[tokens, top_k] distinct experts per token, none of them in `empty`."""
    g = torch.Generator().manual_seed(seed)
    allowed = torch.tensor([e for e in range(experts) if e not in empty])
    return torch.stack([allowed[torch.randperm(allowed.numel(), generator=g)[:top_k]] for _ in range(tokens)]).int()


def _check_align(ids, experts, block_m, counts=None, chunk_counts=None):
    sorted_ids, block_expert, offsets = align(ids, experts, block_m, counts, chunk_counts)
    rows, block_experts = ref.align(ids.numpy(), experts, block_m)
    used = int(offsets[-1])
    assert used == rows.size
    np.testing.assert_array_equal(sorted_ids[:used].numpy(), rows)
    assert (sorted_ids[used:] == ids.numel()).all()
    np.testing.assert_array_equal(block_expert[:used // block_m].numpy(), block_experts)
    assert (block_expert[used // block_m:] == -1).all()
    first_rows = [np.searchsorted(np.repeat(block_experts, block_m), e) for e in range(experts)]
    np.testing.assert_array_equal(offsets[:-1].numpy(), first_rows)


@pytest.mark.parametrize("tokens, experts, top_k, block_m, empty", [
    (300, 8, 1, 16, (5,)),              # k = 1: 3 chunks of 128 tokens
    (77, 64, 8, 4, (0, 9, 63)),         # k = 8: 5 chunks, 2 prefix programs of 32 experts
    (45, 37, 3, 8, (36,)),              # odd tokens and experts: the last prefix program is 5 experts wide
    (161, 256, 8, 16, ()),              # DeepSeek-V3's 256 experts: 41 chunks, 8 prefix programs
])
def test_many_chunks_match_moe_align_block_size(tokens, experts, top_k, block_m, empty):
    ids = _random_ids(tokens, experts, top_k, seed=tokens, empty=empty)
    assert tokens > tokens_per_program(experts, top_k), "the test must span several chunks"
    _check_align(ids, experts, block_m)


def test_many_chunks_from_routes_counts():
    logits = torch.randn(150, 24, generator=torch.Generator().manual_seed(2))
    logits[:, 7] = -50                                                       # expert 7 gets no tokens
    _, ids, counts, chunk_counts = route(logits, 4)
    assert chunk_counts.shape[0] > 1 and counts[7] == 0
    _check_align(ids, 24, 8, counts, chunk_counts)
    torch.library.opcheck(align_op, (ids, 24, 8, counts, chunk_counts))


@pytest.mark.parametrize("chunks, experts, CB, EB", [(13, 19, 4, 8), (1, 5, 1, 8), (8, 32, 8, 32)])
def test_prefix_kernel_is_an_exclusive_scan_down_each_column(chunks, experts, CB, EB):
    counts = np.random.default_rng(chunks).integers(0, 9, (chunks, experts)).astype(np.int32)
    starts = np.full_like(counts, -7)
    prefix_kernel[(-(-experts // EB),)](counts, starts, chunks, experts, CB=CB, EB=EB)
    np.testing.assert_array_equal(starts, np.cumsum(counts, 0) - counts)


def test_prefix_steps_are_bounded_for_any_batch():
    assert prefix_chunks(1, PREFIX_EXPERTS) == 1                     # decode: one chunk, a 1-row tile
    assert prefix_chunks(5, 8) == 8
    assert prefix_chunks(1 << 20, PREFIX_EXPERTS) * PREFIX_EXPERTS == PREFIX_LANES


def test_the_scatter_loads_nothing_inside_its_loops():
    """Each scatter program loads its chunk's ids, the expert totals and one row of chunk starts, all before
    any loop; its loops (over the experts it pads and the unused blocks) only store. The quadratic version
    loaded a histogram row per earlier chunk in a `for q in range(0, chunk)`."""
    E, BM = 4, 4
    rows = max_rows(16, E, BM)
    spec = align_kernel.specialize(np.zeros((8, 2), np.int32), np.zeros(E, np.int32), np.zeros((1, E), np.int32),
                                   np.zeros(rows, np.int32), np.zeros(rows // BM, np.int32),
                                   np.zeros(E + 1, np.int32), 16, E, rows, BM=BM, CHUNK=16, CHUNK_PAD=16, E_PAD=E)
    lines = print_module(spec.module).splitlines()
    loads = [line for line in lines if " = load " in line]
    in_loops = [line for line in loads if line.startswith("    ")]          # a for's body is indented twice
    assert len(loads) == 3 and not in_loops and any(line.lstrip().startswith("for ") for line in lines), loads


def test_count_prefix_and_scatter_on_the_simt_simulator():
    T, E, K, BM = 40, 16, 4, 8
    ids = _random_ids(T, E, K, seed=1, empty=(3,)).numpy()
    BT = tokens_per_program(E, K)
    chunks = -(-T // BT)
    assert chunks > 1
    rows = max_rows(T * K, E, BM)
    sizes = dict(CHUNK=BT * K, CHUNK_PAD=BT * K, E_PAD=E)

    def both(kernel, args, grid, outputs, **constexprs):
        expected = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        kernel[grid](*expected, **constexprs)
        fn = lower(kernel.specialize(*args, **constexprs).module, "sm_80").functions[0]
        got = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        run_threads(fn, got, (*grid, 1, 1)[:3])
        for i in outputs:
            np.testing.assert_array_equal(got[i], expected[i])
        return expected

    counted = both(count_kernel, [ids, np.zeros(E, np.int32), np.zeros((chunks, E), np.int32), T * K, E],
                   (chunks,), [1, 2], **sizes)
    starts = both(prefix_kernel, [counted[2], np.zeros((chunks, E), np.int32), chunks, E], (1,), [1],
                  CB=prefix_chunks(chunks, E), EB=E)[1]
    aligned = both(align_kernel, [ids, counted[1], starts, np.zeros(rows, np.int32),
                                  np.zeros(-(-rows // BM), np.int32), np.zeros(E + 1, np.int32), T * K, E, rows],
                   (chunks,), [3, 4, 5], BM=BM, **sizes)
    expected_rows, _ = ref.align(ids, E, BM)
    np.testing.assert_array_equal(aligned[3][:expected_rows.size], expected_rows)


# (experts, top_k): Mixtral-8x7B, Qwen3-30B-A3B, DeepSeek-V3
@pytest.mark.parametrize("target", ["sm_80", "sm_90a", "gfx942"])
@pytest.mark.parametrize("experts, top_k", [(8, 2), (128, 8), (256, 8)])
def test_the_alignment_kernels_compile_without_spills(target, experts, top_k):
    chunk = tokens_per_program(experts, top_k) * top_k
    E_PAD = 1 << (experts - 1).bit_length()
    sizes = dict(CHUNK=chunk, CHUNK_PAD=1 << (chunk - 1).bit_length(), E_PAD=E_PAD)
    EB = min(PREFIX_EXPERTS, E_PAD)
    launches = [
        (count_kernel, "*i32:16,*i32:16,*i32:16,i32,i32", sizes),
        (prefix_kernel, "*i32:16,*i32:16,i32,i32", dict(CB=prefix_chunks(1 << 20, EB), EB=EB)),
        (align_kernel, "*i32:16,*i32:16,*i32:16,*i32:16,*i32:16,*i32:16,i32,i32,i32", dict(BM=64, **sizes)),
    ]
    for kernel, signature, constexprs in launches:
        compiled = kernel.compile(signature=signature, target=target, strict=True, **constexprs)
        spills = amd_spills(compiled.metadata) if target.startswith("gfx") else compiled.metadata.get("spill_stores", 0)
        assert not spills, f"{kernel.__name__} spills on {target} ({experts} experts): {compiled.metadata}"
