"""tessera.kernels_lib.moe.route and align: top-k routing and the expert-sorted, tile-padded token order.

Specification:

* `route` returns what the float64 reference (Mixtral/Qwen softmax top-k, DeepSeek-V3 sigmoid with a
  correction bias and group-limited top-k, renormalized and scaled) returns: the same experts, ties going to
  the lower expert, and weights to float32 precision; with k = 1 and 8, and up to 256 experts;
* the same launch counts tokens per expert, in total and per routing program;
* `align` gives moe_align_block_size's order (each expert's pairs in pair order, padded to the tile, an
  expert per block, nothing for an expert without tokens), from route's counts or counting on its own;
* the routing and alignment kernels compute on the SIMT simulator what the interpreter computes; routing compiles
  without spills for sm_80, sm_90a and gfx942 at 8, 128 and 256 experts;
* opcheck passes, and bad arguments name the fix.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import moe_reference as ref
from amd_spills import amd_spills
import tessera
from tessera.backends.simt import run_threads
from tessera.kernels_lib.moe import align, route
from tessera.kernels_lib.moe.align import align_kernel, align_op
from tessera.kernels_lib.moe.routing import route_op, routing_kernel, tokens_per_program
from tessera.passes.thread_passes import lower


def _check_route(logits, top_k, **kw):
    weights, ids, counts, chunk_counts = route(logits, top_k, **kw)
    names = dict(scoring="scoring", bias="bias", n_group="n_group", topk_group="topk_group",
                 renormalize="renormalize", scaling_factor="scale")
    expected_w, expected_ids = ref.route(logits.double().numpy(), top_k,
                                         **{names[k]: (v.double().numpy() if isinstance(v, torch.Tensor) else v)
                                            for k, v in kw.items()})
    np.testing.assert_array_equal(ids.numpy(), expected_ids)
    np.testing.assert_allclose(weights.numpy(), expected_w, rtol=1e-5, atol=1e-6)
    E = logits.shape[1]
    np.testing.assert_array_equal(counts.numpy(), np.bincount(expected_ids.reshape(-1), minlength=E))
    BT = tokens_per_program(E, top_k)
    for p, row in enumerate(chunk_counts.numpy()):
        np.testing.assert_array_equal(row, np.bincount(expected_ids[p * BT:(p + 1) * BT].reshape(-1), minlength=E))
    return weights, ids, counts, chunk_counts


@pytest.mark.parametrize("tokens, experts, top_k", [(7, 8, 2), (33, 12, 1), (5, 60, 8), (3, 256, 8)])
def test_softmax_top_k(tokens, experts, top_k):
    logits = torch.randn(tokens, experts, generator=torch.Generator().manual_seed(tokens))
    _check_route(logits, top_k)
    _check_route(logits, top_k, renormalize=False)


def test_ties_go_to_the_lower_expert():
    logits = torch.randint(0, 3, (40, 16), generator=torch.Generator().manual_seed(1)).float()
    _, ids, _, _ = _check_route(logits, 4)
    assert (logits.gather(1, ids.long()).diff(dim=1) == 0).any(), "the test must contain ties"


def test_deepseek_v3_grouped_sigmoid_routing_with_correction_bias():
    g = torch.Generator().manual_seed(3)
    logits, bias = torch.randn(19, 256, generator=g), torch.randn(256, generator=g) * 0.1
    weights, ids, _, _ = _check_route(logits, 8, scoring="sigmoid", bias=bias, n_group=8, topk_group=4,
                                      scaling_factor=2.5)
    assert torch.allclose(weights.sum(1), torch.full((19,), 2.5))
    assert all(len(set((row // 32).tolist())) <= 4 for row in ids)          # at most topk_group groups


def test_group_limited_softmax_routing_without_bias_scores_groups_by_their_best():
    logits = torch.randn(9, 16, generator=torch.Generator().manual_seed(4))
    _check_route(logits, 3, n_group=4, topk_group=2, renormalize=False)


def test_an_expert_nobody_picks_gets_no_rows_or_blocks():
    logits = torch.randn(30, 10, generator=torch.Generator().manual_seed(5))
    logits[:, 6] = -50                                                       # expert 6 gets no tokens
    _, ids, counts, chunk_counts = _check_route(logits, 2)
    assert counts[6] == 0
    for block_m in (1, 4, 16):
        sorted_ids, block_expert, offsets = align(ids, 10, block_m, counts, chunk_counts)
        rows, experts = ref.align(ids.numpy(), 10, block_m)
        used = int(offsets[-1])
        assert used == rows.size and offsets[6] == offsets[7]
        np.testing.assert_array_equal(sorted_ids[:used].numpy(), rows)
        assert (sorted_ids[used:] == ids.numel()).all()
        np.testing.assert_array_equal(block_expert[:used // block_m].numpy(), experts)
        assert (block_expert[used // block_m:] == -1).all()
        np.testing.assert_array_equal(offsets[:-1].numpy(), [np.searchsorted(np.repeat(experts, block_m), e)
                                                             for e in range(10)])


@pytest.mark.parametrize("tokens, experts, top_k, block_m", [(50, 8, 2, 16), (9, 64, 6, 4), (200, 3, 3, 32)])
def test_align_counts_on_its_own_when_not_given_routes_counts(tokens, experts, top_k, block_m):
    ids = torch.stack([torch.randperm(experts, generator=torch.Generator().manual_seed(t))[:top_k]
                       for t in range(tokens)]).int()
    sorted_ids, block_expert, offsets = align(ids, experts, block_m)
    rows, block_experts = ref.align(ids.numpy(), experts, block_m)
    np.testing.assert_array_equal(sorted_ids[:rows.size].numpy(), rows)
    np.testing.assert_array_equal(block_expert[:block_experts.size].numpy(), block_experts)
    assert offsets[-1] == rows.size


def test_routing_and_alignment_on_the_simt_simulator():
    T, E, K, BM = 21, 16, 4, 8
    logits = np.random.default_rng(0).standard_normal((T, E)).astype(np.float32)
    BT = tokens_per_program(E, K)
    chunks = -(-T // BT)
    outputs = [np.zeros((T, K), np.float32), np.zeros((T, K), np.int32), np.zeros(E, np.int32),
               np.zeros((chunks, E), np.int32)]
    constexprs = dict(K=K, SCORING="softmax", HAS_BIAS=False, N_GROUP=4, TOPK_GROUP=2, RENORMALIZE=True, BT=BT,
                      E_PAD=E, K_PAD=K, NG_PAD=4)
    scalars = [T, E, E // 4, 1.0]
    interp = [a.copy() for a in outputs]
    routing_kernel[(chunks,)](logits, logits, *interp, *scalars, **constexprs)
    fn = lower(routing_kernel.specialize(logits, logits, *outputs, *scalars, **constexprs).module,
               "sm_80").functions[0]
    simt = [a.copy() for a in outputs]
    run_threads(fn, [logits, logits, *simt, *scalars], (chunks, 1, 1))
    for got, want in zip(simt, interp):
        np.testing.assert_allclose(got, want, rtol=1e-6)

    rows = T * K + E * (BM - 1)
    aligned = [np.zeros(rows, np.int32), np.zeros(-(-rows // BM), np.int32), np.zeros(E + 1, np.int32)]
    args = [interp[1], interp[2], interp[3]]        # one chunk: chunk_counts stands in for chunk_starts
    sizes = dict(BM=BM, CHUNK=BT * K, CHUNK_PAD=BT * K, E_PAD=E)
    expected = [a.copy() for a in aligned]
    align_kernel[(chunks,)](*args, *expected, T * K, E, rows, **sizes)
    fn = lower(align_kernel.specialize(*args, *aligned, T * K, E, rows, **sizes).module, "sm_80").functions[0]
    run_threads(fn, [*args, *aligned, T * K, E, rows], (chunks, 1, 1))
    for got, want in zip(aligned, expected):
        np.testing.assert_array_equal(got, want)


# (experts, top_k, routing): Mixtral-8x7B, Qwen3-30B-A3B, DeepSeek-V3 (sigmoid, bias, 4 of 8 groups)
@pytest.mark.parametrize("target", ["sm_80", "sm_90a", "gfx942"])
@pytest.mark.parametrize("E, K, grouped", [(8, 2, False), (128, 8, False), (256, 8, True)])
def test_routing_compiles_without_spills(target, E, K, grouped):
    """At 2^15 histogram lanes per program, 256 experts and top-8 needed 512 registers per thread and did not
    compile; `tokens_per_program` now caps the lanes."""
    n_group = 8 if grouped else 1
    compiled = routing_kernel.compile(
        signature="*f32:16,*f32:16,*f32:16,*i32:16,*i32:16,*i32:16,i32,i32,i32,f32", target=target, strict=True,
        K=K, SCORING="sigmoid" if grouped else "softmax", HAS_BIAS=grouped, N_GROUP=n_group,
        TOPK_GROUP=4 if grouped else 1, RENORMALIZE=True, BT=tokens_per_program(E, K),
        E_PAD=tessera.next_power_of_2(E), K_PAD=tessera.next_power_of_2(K), NG_PAD=n_group, num_warps=4)
    spills = amd_spills(compiled.metadata) if target.startswith("gfx") else compiled.metadata.get("spill_stores", 0)
    assert not spills, f"routing spills on {target} ({E} experts): {compiled.metadata}"


def test_opcheck():
    logits = torch.randn(6, 16)
    torch.library.opcheck(route_op, (logits, torch.randn(16), 4, "sigmoid", 4, 2, True, 2.0))
    _, ids, counts, chunk_counts = route(logits, 4)
    torch.library.opcheck(align_op, (ids, 16, 8, counts, chunk_counts))
    torch.library.opcheck(align_op, (ids, 16, 8))


@pytest.mark.parametrize("call, message", [
    (lambda: route(torch.randn(4, 8), 9), r"top_k must be in 1\.\.8"),
    (lambda: route(torch.randn(4, 300), 2), "1 to 256 are supported"),
    (lambda: route(torch.randn(4, 8), 2, scoring="relu"), "scoring must be one of"),
    (lambda: route(torch.randn(4, 12), 2, n_group=5), "n_group must divide the 12 experts"),
    (lambda: route(torch.randn(4, 16), 8, n_group=8, topk_group=2), "leave at least top_k = 8 experts"),
    (lambda: route(torch.randn(4, 8), 2, bias=torch.randn(7)), "float vector of 8"),
    (lambda: align(torch.zeros(4, 2, dtype=torch.int64), 8, 16), r"convert with \.to\(torch\.int32\)"),
    (lambda: align(torch.zeros(4, 2, dtype=torch.int32), 8, 12), "block_m must be a power of two"),
])
def test_bad_arguments_name_the_fix(call, message):
    with pytest.raises(ValueError, match=message):
        call()
