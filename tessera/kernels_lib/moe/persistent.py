"""The one-launch MoE layer: routing, alignment, permute, both expert GEMMs and the combine in one persistent
kernel whose programs take work items by ticket (the FlashMoE idea on one GPU; docs/moe.md).

Each program takes its next item with `ticket = atomic_add(queue, 1)` until the tickets run out. Tickets map to
items in a fixed order, and an item waits (polling a counter: `wait_for`) only for items with smaller tickets:

    tickets             item                                             waits for
    0 .. P-1            route chunk p (or count its ids), then routed++  nothing
    P .. P+S-1          prefix slice s (EB experts), then prefixed++      routed == P
    next P              scatter chunk p, permute its x rows, aligned++   prefixed == S
    next B * NU         gate_up tile (b, n), block by block; h_done[b]++  aligned == P
    next B * ND         down tile (b, n), block by block; downs++         h_done[b] == NU
    last C              combine a tile of out                            downs == (rows in use / BM) * ND

Every gate_up tile comes before every down tile, as in the multi-kernel path: all resident programs stream
gate_up's weights at once, and a down tile waits only for its own block's gate_up tiles, taken long before
(block b's down tiles start while later blocks' gate_up tiles still run). Ordering the tickets block by block
instead (b's NU gate_up tiles, then its ND down tiles) had the programs that took b's down tiles spin while
NU programs streamed: with DeepSeek-V3 at decode (NU = 32, ND = 112, 132 programs) a quarter of the GPU read
weights at a time, 3.4x slower than the multi-kernel path in a graph (H100, 2026-11-26).

A ticket is taken only by a running program and its waits point to smaller tickets, all held by running
programs that wait on still smaller ones, so any number of resident programs (one included) finishes, with no
grid barrier and no cooperative launch. The bodies are the multi-kernel path's own (`route_chunk`,
`count_chunk`, `prefix_slice`, `scatter_chunk`, `gate_up_tile`, `down_tile`, `combine_tile`), so the result is
the multi-kernel path's bit for bit with the same tiles (the deterministic top-k sum; the atomic one adds in
another order). Blocks past the rows in use (known once aligned) are skipped. Padding rows of xs are never
written (the permute writes real pairs' rows only): a row of a GEMM depends only on its own row of A, and
down's epilogue stores no padding row, so whatever they hold never reaches out.

The weights are read through 2-D views of all experts ([E * 2I, H] and [E * H, I]), whose row counts come in
as kernel arguments (w13_rows, w2_rows) so that the host can build their TMA tensor maps on sm_90a.
`sync` holds the counters: [queue, routed, prefixed, aligned, downs, h_done[0], h_done[1], ...], zeroed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

import tessera
import tessera.torch

from ..gemm_alignment import state_multiples
from ..targets import plan_target
from . import plan as plans
from .align import PREFIX_EXPERTS, count_chunk, max_rows, prefix_chunks, prefix_slice, scatter_chunk
from .common import kernel_arg
from .experts import combine_tile, down_tile, gate_up_tile
from .mlp import check_experts, pipelining, tiles
from .routing import check_routing, route_chunk, tokens_per_program


QUEUE, ROUTED, PREFIXED, ALIGNED, DOWNS, H_DONE = 0, 1, 2, 3, 4, 5
FIRST_PAUSE_NS, LONGEST_PAUSE_NS = 32, 512     # a wait's backoff doubles from 32 ns up to 0.5 us


@tessera.func
def wait_for(counter_ptr, target):
    """Poll until the counter reaches `target`. Each poll is an acquire load (one thread's, handed to the others
    through shared memory): once it sees the count, this program sees every row the counted items wrote before
    their acquire-release increment. Between polls the threads sleep, doubling from FIRST_PAUSE_NS to
    LONGEST_PAUSE_NS, so waiting programs leave the memory system to the ones they wait for. On sm_90a the
    compiler fences the async proxy before this kernel's TMA fills (`fence.proxy.async.global`), so TMA reads the
    rows the acquire made visible."""
    pause = FIRST_PAUSE_NS
    while tessera.load(counter_ptr, sem="acquire") < target:
        tessera.nanosleep(pause)
        pause = tessera.minimum(pause * 2, LONGEST_PAUSE_NS)


@tessera.func
def permute_rows(x_ptr, xs_ptr, rows, chunk, numel, H, CHUNK, CHUNK_PAD, TOP_K, BH):
    """xs[rows[i]] = x[pair i // TOP_K] for the pairs of chunk `chunk` (scatter_chunk's rows), BH columns a step."""
    lanes = tessera.arange(0, CHUNK_PAD)
    pairs = chunk * CHUNK + lanes
    real = (lanes < CHUNK) & (pairs < numel)
    source = (pairs // TOP_K).to(tessera.i64)[:, None] * H
    target = rows.to(tessera.i64)[:, None] * H
    for c in range(0, H, BH):
        cols = c + tessera.arange(0, BH)
        inside = real[:, None] & (cols < H)[None, :]
        tessera.store(xs_ptr + target + cols[None, :], tessera.load(x_ptr + source + cols[None, :], mask=inside),
                      mask=inside)


@tessera.kernel
def moe_layer_kernel(logits_ptr, bias_ptr, x_ptr, w13_ptr, w2_ptr, weights_ptr, ids_ptr, counts_ptr,
                     chunk_counts_ptr, chunk_starts_ptr, sorted_ptr, block_expert_ptr, offsets_ptr, xs_ptr, h_ptr,
                     y_ptr, out_ptr, sync_ptr, T, H, I, E, group_size, scale, numel, max_rows, chunks, w13_rows,
                     w2_rows,
                     ROUTE: tessera.constexpr, K: tessera.constexpr, SCORING: tessera.constexpr,
                     HAS_BIAS: tessera.constexpr, N_GROUP: tessera.constexpr, TOPK_GROUP: tessera.constexpr,
                     RENORMALIZE: tessera.constexpr, BT: tessera.constexpr, E_PAD: tessera.constexpr,
                     K_PAD: tessera.constexpr, NG_PAD: tessera.constexpr, CHUNK: tessera.constexpr,
                     CHUNK_PAD: tessera.constexpr, CB: tessera.constexpr, EB: tessera.constexpr,
                     BM: tessera.constexpr, ACTIVATION: tessera.constexpr, ATOMIC: tessera.constexpr,
                     BN_UP: tessera.constexpr, BK_UP: tessera.constexpr, STAGES_UP: tessera.constexpr,
                     BN_DOWN: tessera.constexpr, BK_DOWN: tessera.constexpr, STAGES_DOWN: tessera.constexpr,
                     BH: tessera.constexpr, BTC: tessera.constexpr, ALIGN: tessera.constexpr = (1, 1)):
    state_multiples((H, I), ALIGN)      # what the op checked H and I are multiples of (`mlp.pipelining`)
    slices = tessera.cdiv(E, EB)
    n_up, n_down = tessera.cdiv(I, BN_UP), tessera.cdiv(H, BN_DOWN)
    gemm_first = 2 * chunks + slices
    combine_first = gemm_first + tessera.cdiv(max_rows, BM) * (n_up + n_down)
    col_tiles = tessera.cdiv(H, BH)
    total = combine_first + tessera.cdiv(T, BTC) * col_tiles
    ticket = tessera.atomic_add(sync_ptr + QUEUE, 1)
    while ticket < total:
        if ticket < chunks:
            if ROUTE:
                route_chunk(logits_ptr, bias_ptr, weights_ptr, ids_ptr, counts_ptr, chunk_counts_ptr, T, E,
                            group_size, scale, ticket, chunks, K, SCORING, HAS_BIAS, N_GROUP, TOPK_GROUP,
                            RENORMALIZE, BT, E_PAD, K_PAD, NG_PAD)
            else:
                count_chunk(ids_ptr, counts_ptr, chunk_counts_ptr, numel, E, ticket, CHUNK, CHUNK_PAD, E_PAD)
            tessera.atomic_add(sync_ptr + ROUTED, 1)
        elif ticket < chunks + slices:
            wait_for(sync_ptr + ROUTED, chunks)
            prefix_slice(chunk_counts_ptr, chunk_starts_ptr, chunks, E, ticket - chunks, CB, EB)
            tessera.atomic_add(sync_ptr + PREFIXED, 1)
        elif ticket < gemm_first:
            wait_for(sync_ptr + PREFIXED, slices)
            chunk = ticket - chunks - slices
            rows = scatter_chunk(ids_ptr, counts_ptr, chunk_starts_ptr, sorted_ptr, block_expert_ptr, offsets_ptr,
                                 numel, E, max_rows, chunk, chunks, BM, CHUNK, CHUNK_PAD, E_PAD)
            permute_rows(x_ptr, xs_ptr, rows, chunk, numel, H, CHUNK, CHUNK_PAD, K, BH)
            tessera.atomic_add(sync_ptr + ALIGNED, 1)
        elif ticket < combine_first:
            wait_for(sync_ptr + ALIGNED, chunks)
            item = ticket - gemm_first
            up_items = tessera.cdiv(max_rows, BM) * n_up                # every gate_up tile, then every down tile
            down = item >= up_items
            per_block = tessera.where(down, n_down, n_up)
            item = tessera.where(down, item - up_items, item)
            block, tile = item // per_block, item % per_block
            if block * BM < tessera.load(offsets_ptr + E):          # a block of rows in use
                if down:
                    wait_for(sync_ptr + H_DONE + block, n_up)
                    down_tile(h_ptr, w2_ptr, y_ptr, weights_ptr, sorted_ptr, block_expert_ptr, block, tile,
                              max_rows, H, I, w2_rows, numel, K, ATOMIC, BM, BN_DOWN, BK_DOWN, STAGES_DOWN)
                    tessera.atomic_add(sync_ptr + DOWNS, 1)
                else:
                    gate_up_tile(xs_ptr, w13_ptr, h_ptr, block_expert_ptr, block, tile, max_rows, H, I, w13_rows,
                                 ACTIVATION, BM, BN_UP, BK_UP, STAGES_UP)
                    tessera.atomic_add(sync_ptr + H_DONE + block, 1)
        else:
            wait_for(sync_ptr + ALIGNED, chunks)
            wait_for(sync_ptr + DOWNS, tessera.load(offsets_ptr + E) // BM * n_down)
            item = ticket - combine_first
            if ATOMIC:      # y is the float32 top-k sum already: out is its cast
                combine_tile(y_ptr, out_ptr, item // col_tiles, item % col_tiles, T, H, 1, 1, BTC, BH)
            else:
                combine_tile(y_ptr, out_ptr, item // col_tiles, item % col_tiles, T, H, K, K_PAD, BTC, BH)
        ticket = tessera.atomic_add(sync_ptr + QUEUE, 1)


# -- host side ------------------------------------------------------------------------------------------------

COLUMNS = 128       # BH: columns of x one permute step copies, and of out one combine item writes
COMBINE_TOKENS = 16  # BTC: tokens of out one combine item writes
CPU_PROGRAMS = 4    # programs on the interpreter (any number finishes; tests vary it)


def _tiles(x, T: int, K: int, E: int, block_m: Optional[int]) -> plans.Plan:
    """The multi-kernel path's plan for this batch (`plan.plan`) on an NVIDIA GPU, the one-launch plan of the
    device's AMD target (`plan.AMD_ONE_LAUNCH[targets.plan_target()]`, same BM) on AMD, the interpreter's on the
    CPU."""
    if block_m is None:
        block_m = plans.CPU_PLAN.BM if x.device.type == "cpu" else plans.plan(T, K, E).BM
    if x.device.type != "cpu" and torch.version.hip is not None:
        for amd in plans.AMD_ONE_LAUNCH[plan_target(x.device)].values():
            if amd.BM == block_m:
                return amd
    return tiles(block_m, x)


# The kernel's parameters as the ops launch them with bf16 activations and weights (compile tests, AOT): pointers
# 16-byte aligned; the bias, weights and counters are float32 / int32.
SIGNATURE = ("*bf16:16,*f32:16,*bf16:16,*bf16:16,*bf16:16,*f32:16,*i32:16,*i32:16,*i32:16,*i32:16,*i32:16,*i32:16,"
             "*i32:16,*bf16:16,*bf16:16,*bf16:16,*bf16:16,*i32:16,i32,i32:16,i32:16,i32,i32,f32,i32,i32,i32,i32:16,i32:16")


def constexprs_for(p: plans.Plan, E: int, K: int, chunks: int, *, route: bool, scoring: str = "softmax",
                   has_bias: bool = False, n_group: int = 1, topk_group: int = 1, renormalize: bool = True,
                   activation: str = "silu", atomic: bool = False) -> dict:
    """`moe_layer_kernel`'s constexprs for plan `p`, E experts, top-K and `chunks` routing chunks."""
    BT = tokens_per_program(E, K)
    E_PAD, EB, chunk = tessera.next_power_of_2(E), min(PREFIX_EXPERTS, tessera.next_power_of_2(E)), BT * K
    return dict(
        ROUTE=route, K=K, SCORING=scoring, HAS_BIAS=has_bias, N_GROUP=n_group, TOPK_GROUP=topk_group,
        RENORMALIZE=renormalize, BT=BT, E_PAD=E_PAD, K_PAD=tessera.next_power_of_2(K),
        NG_PAD=tessera.next_power_of_2(n_group), CHUNK=chunk, CHUNK_PAD=tessera.next_power_of_2(chunk),
        CB=prefix_chunks(chunks, EB), EB=EB, BM=p.BM, ACTIVATION=activation, ATOMIC=atomic,
        BN_UP=p.gate_up.BN, BK_UP=p.gate_up.BK, STAGES_UP=p.gate_up.stages, BN_DOWN=p.down.BN,
        BK_DOWN=p.down.BK, STAGES_DOWN=p.down.stages, BH=COLUMNS, BTC=COMBINE_TOKENS)


@dataclass
class LayerLaunch:
    """One launch of `moe_layer_kernel`: its arguments (OUT_ARG is out's index), constexprs, work items and warps,
    and the tensors the op returns."""

    args: list
    constexprs: dict
    items: int
    num_warps: int
    returns: tuple


OUT_ARG = 16


def layer_launch(x, w13, w2, logits, bias, weights, ids, top_k: int, scoring: str, n_group: int, topk_group: int,
                 renormalize: bool, scaling_factor: float, activation: str, atomic: bool,
                 block_m: Optional[int], plan: Optional[plans.Plan] = None) -> LayerLaunch:
    """Allocate the layer's buffers (out, and weights and ids when routing here) and lay out the launch;
    `plan` overrides the tiles (tests: wgmma tiles for the simulator)."""
    T, H = x.shape
    E, two_i, _ = w13.shape
    I, K, device = two_i // 2, top_k, x.device
    p = plan or _tiles(x, T, K, E, block_m)
    numel, BT = T * K, tokens_per_program(E, K)
    chunks, rows = tessera.cdiv(T, BT), max_rows(T * K, E, p.BM)
    route_here = logits is not None
    if route_here:
        weights = torch.empty((T, K), dtype=torch.float32, device=device)
        ids = torch.empty((T, K), dtype=torch.int32, device=device)
    counts = torch.zeros(E, dtype=torch.int32, device=device)
    out = torch.empty((T, H), dtype=x.dtype, device=device)
    i32 = dict(dtype=torch.int32, device=device)
    blocks = tessera.cdiv(rows, p.BM)
    chunk_counts, chunk_starts = torch.empty((chunks, E), **i32), torch.empty((chunks, E), **i32)
    sorted_ids, block_expert, offsets = torch.empty(rows, **i32), torch.empty(blocks, **i32), torch.empty(E + 1, **i32)
    xs, h = torch.empty((rows, H), dtype=x.dtype, device=device), torch.empty((rows, I), dtype=x.dtype, device=device)
    y = torch.zeros((T, H), dtype=torch.float32, device=device) if atomic else \
        torch.empty((T * K, H), dtype=x.dtype, device=device)
    sync = torch.zeros(H_DONE + blocks, **i32)
    tensors = [logits if route_here else x, bias if bias is not None else x, x, w13.contiguous(), w2.contiguous(),
               weights.contiguous(), ids.contiguous(), counts, chunk_counts, chunk_starts, sorted_ids, block_expert,
               offsets, xs, h, y, out, sync]
    args = [kernel_arg(t) for t in tensors] + [T, H, I, E, E // n_group, float(scaling_factor), numel, rows, chunks,
                                                E * 2 * I, E * H]
    constexprs = constexprs_for(p, E, K, chunks, route=route_here, scoring=scoring, has_bias=bias is not None,
                                n_group=n_group, topk_group=topk_group, renormalize=renormalize,
                                activation=activation, atomic=atomic)
    # the row alignment the op checked, and the plan's pipelines only where every row starts 16-byte aligned
    up = pipelining(p.gate_up, (H, I), x.element_size() * 8, x, tensors[3], tensors[4], xs, h)
    down = pipelining(p.down, (H, I), x.element_size() * 8, x, tensors[3], tensors[4], xs, h)
    constexprs.update(ALIGN=up["ALIGN"], STAGES_UP=up["STAGES"], STAGES_DOWN=down["STAGES"])
    items = (2 * chunks + tessera.cdiv(E, constexprs["EB"])
             + blocks * (tessera.cdiv(I, p.gate_up.BN) + tessera.cdiv(H, p.down.BN))
             + tessera.cdiv(T, COMBINE_TOKENS) * tessera.cdiv(H, COLUMNS))
    return LayerLaunch(args, constexprs, items, p.gate_up.num_warps, (out, weights, ids, counts))


def _launch(*layer_args, programs: Optional[int]):
    """Launch `moe_layer_kernel` once over min(items, programs) programs (default: as many as the GPU holds at
    once); returns (out, weights, ids, counts)."""
    launch = layer_launch(*layer_args)
    if layer_args[0].shape[0] == 0:
        return launch.returns
    if programs is None:
        programs = CPU_PROGRAMS if layer_args[0].device.type == "cpu" else \
            moe_layer_kernel.resident_programs(*launch.args, **launch.constexprs, num_warps=launch.num_warps)
    grid = (max(1, min(programs, launch.items)),)
    moe_layer_kernel[grid](*launch.args, **launch.constexprs, num_warps=launch.num_warps)
    return launch.returns


def _check_routing_inputs(x, logits, bias, top_k, scoring, n_group, topk_group) -> None:
    if logits.dim() != 2 or logits.shape[0] != x.shape[0]:
        raise ValueError(f"tessera::moe_layer: logits must be [{x.shape[0]}, experts] (one row per token of x), "
                         f"got {tuple(logits.shape)}")
    check_routing(logits, bias, top_k, scoring, n_group, topk_group)


def _layer(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, logits: torch.Tensor, bias: Optional[torch.Tensor],
           top_k: int, scoring: str, n_group: int, topk_group: int, renormalize: bool, scaling_factor: float,
           activation: str, atomic: bool, block_m: Optional[int],
           programs: Optional[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The implementation of `torch.ops.tessera.moe_layer`: see `moe_layer`."""
    _check_routing_inputs(x, logits, bias, top_k, scoring, n_group, topk_group)
    T = x.shape[0]
    check_experts(x, w13, w2, x.new_empty((T, top_k)), x.new_empty((T, top_k), dtype=torch.int32), activation)
    return _launch(x, w13, w2, logits.contiguous(), None if bias is None else bias.contiguous(), None, None, top_k,
                   scoring, n_group, topk_group, renormalize, scaling_factor, activation, atomic, block_m,
                   programs=programs)


layer_op = torch.library.custom_op("tessera::moe_layer", _layer, mutates_args=())


@layer_op.register_fake
def _layer_fake(x, w13, w2, logits, bias, top_k, scoring, n_group, topk_group, renormalize, scaling_factor,
                activation, atomic, block_m, programs):
    _check_routing_inputs(x, logits, bias, top_k, scoring, n_group, topk_group)
    T, E = logits.shape
    return (x.new_empty((T, w2.shape[1])), x.new_empty((T, top_k), dtype=torch.float32),
            x.new_empty((T, top_k), dtype=torch.int32), x.new_empty((E,), dtype=torch.int32))


def _experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
             activation: str, atomic: bool, block_m: Optional[int], programs: Optional[int]) -> torch.Tensor:
    """The implementation of `torch.ops.tessera.moe_experts_one_launch`: `experts(..., one_launch=True)`."""
    check_experts(x, w13, w2, weights, ids, activation)
    out, *_ = _launch(x, w13, w2, None, None, weights.float(), ids, ids.shape[1], "softmax", 1, 1, True, 1.0,
                      activation, atomic, block_m, programs=programs)
    return out


experts_op = torch.library.custom_op("tessera::moe_experts_one_launch", _experts, mutates_args=())


@experts_op.register_fake
def _experts_fake(x, w13, w2, weights, ids, activation, atomic, block_m, programs):
    check_experts(x, w13, w2, weights, ids, activation)
    return x.new_empty((x.shape[0], w2.shape[1]))


def _inference_only(*tensors) -> None:
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise ValueError("tessera::moe one_launch=True is inference-only (no autograd through the persistent "
                         "kernel); run under torch.no_grad() / torch.inference_mode(), or use one_launch=False "
                         "to train")


def moe_layer(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, logits: torch.Tensor, top_k: int, *,
              scoring: str = "softmax", bias: Optional[torch.Tensor] = None, n_group: int = 1, topk_group: int = 1,
              renormalize: bool = True, scaling_factor: float = 1.0, activation: str = "silu",
              atomic: bool = False, block_m: Optional[int] = None, programs: Optional[int] = None):
    """`route` + `experts` in one launch: returns (out [T, H], weights, ids, counts) as route and experts would.

    The router's logits [T, E] come in (the router GEMM stays torch's); routing options are `route`'s, the
    rest `experts`'. `programs`: how many persistent programs (default: as many as the GPU holds at once,
    from the occupancy query; 4 on the CPU interpreter). Inference only. This is `torch.ops.tessera.moe_layer`.
    """
    _inference_only(x, w13, w2, logits)
    op = _layer if tessera.torch.unobserved(x, w13, w2, logits, bias) else layer_op
    return op(x, w13, w2, logits, bias, top_k, scoring, n_group, topk_group, renormalize, scaling_factor,
              activation, atomic, block_m, programs)


def experts_one_launch(x, w13, w2, weights, ids, *, activation: str = "silu", atomic: bool = False,
                       block_m: Optional[int] = None, programs: Optional[int] = None) -> torch.Tensor:
    """`experts` (counting, alignment, permute, gate_up, down, combine) in one launch; see `moe_layer`."""
    _inference_only(x, w13, w2, weights)
    op = _experts if tessera.torch.unobserved(x, w13, w2, weights, ids) else experts_op
    return op(x, w13, w2, weights, ids, activation, atomic, block_m, programs)
