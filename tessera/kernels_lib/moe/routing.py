"""MoE routing: each token's router logits -> its top-k experts and their weights, and tokens per expert.

One program takes BT tokens, a BT x E tile of logits (E padded to a power
of two with lanes that are never chosen). Scores are softmax(logits)
(Mixtral, Qwen) or sigmoid(logits) (DeepSeek-V3). The experts are chosen
on `scores + bias` (DeepSeek-V3's correction bias steers the choice only)
and, with n_group > 1, only among the topk_group best groups of
E / n_group experts (DeepSeek's group-limited routing: a group scores the
sum of its two best experts when there is a bias, as V3 does, else its
best). Top-k is k rounds of argmax (ties: the lower expert first), O(k E)
per token, where ranking all experts would be O(E^2). The weights are the
chosen experts' scores (not the biased ones), renormalized to sum to 1 if
asked, times the routed scaling factor.

The same launch counts what the next steps need: each program's histogram
of expert ids (one row of `chunk_counts`, which the alignment's counting
sort reads) and, with atomic adds, the per-expert totals `counts` (which a
load-balancing loss reads, and all-reduces for the global batch).

`route(...)` is the op `torch.ops.tessera.moe_route`.
"""

from __future__ import annotations

from typing import Optional

import torch

import tessera
import tessera.torch

from .common import check_device, kernel_arg

SCORING = ("softmax", "sigmoid")
MAX_TOP_K = 8
MAX_EXPERTS = 256
NEG_INF = float("-inf")


@tessera.func
def best_groups(choice, cols, group_size, N_GROUP, TOPK_GROUP, TOP2, NG_PAD):
    """`choice` with every expert outside its token's TOPK_GROUP best groups set to -inf (NG_PAD: N_GROUP
    rounded up to a power of two)."""
    group = cols // group_size
    lanes = tessera.arange(0, NG_PAD)
    scores = tessera.full((choice.shape[0], NG_PAD), NEG_INF)
    for g in tessera.static_range(N_GROUP):
        member = tessera.where((group == g)[None, :], choice, NEG_INF)
        score = tessera.max(member, 1)
        if TOP2:        # DeepSeek-V3: the group's two best experts
            first = cols[None, :] == tessera.argmax(member, 1)[:, None]
            score = score + tessera.max(tessera.where(first, NEG_INF, member), 1)
        scores = tessera.where(lanes[None, :] == g, score[:, None], scores)
    keep = group[None, :] < 0
    for _ in tessera.static_range(TOPK_GROUP):
        best = tessera.argmax(scores, 1)
        keep = keep | (group[None, :] == best[:, None])
        scores = tessera.where(lanes[None, :] == best[:, None], NEG_INF, scores)
    return tessera.where(keep, choice, NEG_INF)


@tessera.kernel
def routing_kernel(logits_ptr, bias_ptr, weights_ptr, ids_ptr, counts_ptr, chunk_counts_ptr, T, E, group_size,
                   scale, K: tessera.constexpr, SCORING: tessera.constexpr, HAS_BIAS: tessera.constexpr,
                   N_GROUP: tessera.constexpr, TOPK_GROUP: tessera.constexpr, RENORMALIZE: tessera.constexpr,
                   BT: tessera.constexpr, E_PAD: tessera.constexpr, K_PAD: tessera.constexpr,
                   NG_PAD: tessera.constexpr):
    route_chunk(logits_ptr, bias_ptr, weights_ptr, ids_ptr, counts_ptr, chunk_counts_ptr, T, E, group_size, scale,
                tessera.program_id(0), tessera.num_programs(0), K, SCORING, HAS_BIAS, N_GROUP, TOPK_GROUP,
                RENORMALIZE, BT, E_PAD, K_PAD, NG_PAD)


@tessera.func
def route_chunk(logits_ptr, bias_ptr, weights_ptr, ids_ptr, counts_ptr, chunk_counts_ptr, T, E, group_size, scale,
                chunk, chunks, K, SCORING, HAS_BIAS, N_GROUP, TOPK_GROUP, RENORMALIZE, BT, E_PAD, K_PAD, NG_PAD):
    """Tokens chunk * BT .. of `chunks`: their top-K experts and weights, the chunk's histogram (a row of
    chunk_counts) and its atomic add into counts (the routing kernel's program, and the one-launch layer's
    routing item)."""
    cols = tessera.arange(0, E_PAD)
    logits = tessera.view(logits_ptr, (T, E)).block((BT, E_PAD), (chunk, 0)).load().to(tessera.f32)
    logits = tessera.where((cols < E)[None, :], logits, NEG_INF)        # padding lanes: no probability
    if SCORING == "softmax":
        exps = tessera.exp(logits - tessera.max(logits, 1)[:, None])
        scores = exps / tessera.sum(exps, 1)[:, None]
    else:
        scores = tessera.sigmoid(logits)
    choice = scores
    if HAS_BIAS:
        choice = choice + tessera.load(bias_ptr + cols, mask=cols < E).to(tessera.f32)[None, :]
    choice = tessera.where((cols < E)[None, :], choice, NEG_INF)        # padding lanes are never chosen
    if N_GROUP > 1:
        choice = best_groups(choice, cols, group_size, N_GROUP, TOPK_GROUP, HAS_BIAS, NG_PAD)

    slots = tessera.arange(0, K_PAD)[None, :]
    weights = tessera.zeros((BT, K_PAD), dtype=tessera.f32)
    ids = tessera.zeros((BT, K_PAD), dtype=tessera.i32)
    for j in tessera.static_range(K):          # k rounds of argmax: the best remaining expert each time
        best = tessera.argmax(choice, 1)
        picked = cols[None, :] == best[:, None]
        weights = tessera.where(slots == j, tessera.sum(tessera.where(picked, scores, 0.0), 1)[:, None], weights)
        ids = tessera.where(slots == j, best[:, None], ids)
        choice = tessera.where(picked, NEG_INF, choice)
    if RENORMALIZE:
        weights = weights / tessera.sum(weights, 1)[:, None]
    tessera.view(weights_ptr, (T, K)).block((BT, K_PAD), (chunk, 0)).store(weights * scale)
    tessera.view(ids_ptr, (T, K)).block((BT, K_PAD), (chunk, 0)).store(ids)

    rows = chunk * BT + tessera.arange(0, BT)
    real = (rows[:, None] < T) & (slots < K)
    hist = tessera.histogram(tessera.reshape(ids, (BT * K_PAD,)), E_PAD, mask=tessera.reshape(real, (BT * K_PAD,)))
    tessera.view(chunk_counts_ptr, (chunks, E)).block((1, E_PAD), (chunk, 0)).store(hist[None, :])
    tessera.atomic_add(counts_ptr + cols, hist, mask=cols < E)


def tokens_per_program(num_experts: int, top_k: int) -> int:
    """BT: tokens per routing program. Its histogram compares BT * K_PAD ids with E_PAD bins as 64-bit
    lanes, at most 2^13 of them (64 per thread at 4 warps; at 2^15, DeepSeek-V3's 256 experts and top-8
    needed 512 registers per thread and did not compile for a GPU), and the alignment compares a chunk's
    BT * K pairs with each other (at most 128 of them). Small chunks cost nothing extra: the alignment's
    launches read each chunk's histogram a fixed number of times."""
    k_pad = tessera.next_power_of_2(top_k)
    lanes = tessera.next_power_of_2(num_experts) * k_pad
    return max(1, min(128 // k_pad, (1 << 13) // lanes))


def check_routing(logits, bias, top_k, scoring, n_group, topk_group) -> None:
    if logits.dim() != 2 or not logits.dtype.is_floating_point:
        raise ValueError(f"tessera::moe_route: logits must be a float [tokens, experts] matrix, got "
                         f"{logits.dtype} {tuple(logits.shape)}")
    E = logits.shape[1]
    if not 1 <= E <= MAX_EXPERTS:
        raise ValueError(f"tessera::moe_route: {E} experts; 1 to {MAX_EXPERTS} are supported")
    if not 1 <= top_k <= min(MAX_TOP_K, E):
        raise ValueError(f"tessera::moe_route: top_k must be in 1..{min(MAX_TOP_K, E)} for {E} experts, got {top_k}")
    if scoring not in SCORING:
        raise ValueError(f"tessera::moe_route: scoring must be one of {SCORING}, got {scoring!r}")
    if bias is not None and (bias.shape != (E,) or not bias.dtype.is_floating_point):
        raise ValueError(f"tessera::moe_route: bias (the correction bias) must be a float vector of {E}, got "
                         f"{bias.dtype} {tuple(bias.shape)}")
    if n_group < 1 or E % n_group:
        raise ValueError(f"tessera::moe_route: n_group must divide the {E} experts, got {n_group}")
    if not 1 <= topk_group <= n_group or top_k > topk_group * (E // n_group):
        raise ValueError(f"tessera::moe_route: topk_group must be in 1..n_group ({n_group}) and leave at least "
                         f"top_k = {top_k} experts to choose from, got {topk_group}")
    check_device("moe_route", logits, bias=bias)


def _route(logits: torch.Tensor, bias: Optional[torch.Tensor], top_k: int, scoring: str, n_group: int,
           topk_group: int, renormalize: bool,
           scaling_factor: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The implementation of `torch.ops.tessera.moe_route`: see `route`."""
    check_routing(logits, bias, top_k, scoring, n_group, topk_group)
    T, E = logits.shape
    BT = tokens_per_program(E, top_k)
    chunks = tessera.cdiv(T, BT)
    device = logits.device
    weights = torch.empty((T, top_k), dtype=torch.float32, device=device)
    ids = torch.empty((T, top_k), dtype=torch.int32, device=device)
    counts = torch.zeros(E, dtype=torch.int32, device=device)
    chunk_counts = torch.empty((chunks, E), dtype=torch.int32, device=device)
    if T == 0:
        return weights, ids, counts, chunk_counts
    args = [kernel_arg(t) for t in (logits.contiguous(), logits if bias is None else bias.contiguous(), weights,
                                    ids, counts, chunk_counts)]
    routing_kernel[(chunks,)](*args, T, E, E // n_group, float(scaling_factor), K=top_k, SCORING=scoring,
                              HAS_BIAS=bias is not None, N_GROUP=n_group, TOPK_GROUP=topk_group,
                              RENORMALIZE=renormalize, BT=BT, E_PAD=tessera.next_power_of_2(E),
                              K_PAD=tessera.next_power_of_2(top_k),
                              NG_PAD=tessera.next_power_of_2(n_group), num_warps=4)
    return weights, ids, counts, chunk_counts


route_op = torch.library.custom_op("tessera::moe_route", _route, mutates_args=())


@route_op.register_fake
def _route_fake(logits, bias, top_k, scoring, n_group, topk_group, renormalize, scaling_factor):
    check_routing(logits, bias, top_k, scoring, n_group, topk_group)
    T, E = logits.shape
    chunks = tessera.cdiv(T, tokens_per_program(E, top_k))
    return (logits.new_empty((T, top_k), dtype=torch.float32), logits.new_empty((T, top_k), dtype=torch.int32),
            logits.new_empty((E,), dtype=torch.int32), logits.new_empty((chunks, E), dtype=torch.int32))


def route(logits: torch.Tensor, top_k: int, *, scoring: str = "softmax", bias: Optional[torch.Tensor] = None,
          n_group: int = 1, topk_group: int = 1, renormalize: bool = True,
          scaling_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Route each token (a row of `logits`, [T, E], E <= 256) to its `top_k` (<= 8) experts.

    Returns (weights [T, top_k] float32, expert ids [T, top_k] int32, tokens per
    expert [E] int32, and each routing program's expert histogram
    [programs, E] int32, which `align` reads). Scores are `scoring`
    ("softmax": Mixtral, Qwen; "sigmoid": DeepSeek-V3) of the logits; experts
    are chosen on scores + `bias` (a correction bias that steers the choice
    but not the weights), within the `topk_group` best of `n_group` groups
    of experts when n_group > 1 (DeepSeek-V3: n_group=8, topk_group=4);
    weights are the chosen scores, renormalized to sum to 1 when
    `renormalize`, times `scaling_factor`. Ties go to the lower expert id.
    This is the op `torch.ops.tessera.moe_route`, called directly where
    nothing observes the dispatch (`tessera.torch.unobserved`).
    """
    op = _route if tessera.torch.unobserved(logits, bias) else route_op
    return op(logits, bias, top_k, scoring, n_group, topk_group, renormalize, scaling_factor)
