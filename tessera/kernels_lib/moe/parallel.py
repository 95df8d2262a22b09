"""Expert parallelism over torch.distributed: each rank holds E / world experts and its own tokens.

    dispatch   each (token, slot) pair's row of x, its routing weight and its expert (local to the
               owner) go to the rank owning the expert: all_to_all, pairs ordered by owner
    compute    the owner runs its experts on what it received (`experts`, one slot per row)
    combine    the weighted rows come back the same way (all_to_all) and each token sums its slots

Rank r owns experts r * E_local ... (r + 1) * E_local - 1. The all_to_alls
are differentiable (`_AllToAll`), and so is the whole: gradients of
x, the routing weights and each rank's expert weights flow back through
the same exchanges. Every rank must call it (a collective), with the same
number of experts per rank.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from .mlp import experts


class _AllToAll(torch.autograd.Function):
    """dist.all_to_all_single of rows; its gradient goes back the same way with the splits swapped."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, send: list[int], recv: list[int], group) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = t.new_empty((sum(recv), *t.shape[1:]))
        dist.all_to_all_single(out, t.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _AllToAll.apply(grad.contiguous(), ctx.recv, ctx.send, ctx.group), None, None, None


def _exchange(t: torch.Tensor, send: list[int], recv: list[int], group) -> torch.Tensor:
    """Rows of `t`, send[i] of them to rank i, in; recv[i] rows from rank i out (differentiable)."""
    return _AllToAll.apply(t, send, recv, group)


def expert_parallel(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w13_local: torch.Tensor,
                    w2_local: torch.Tensor, num_experts: int, group: Optional["dist.ProcessGroup"] = None, *,
                    activation: str = "silu") -> torch.Tensor:
    """The routed experts of this rank's tokens x [T, H] (weights, ids: [T, k] over all num_experts), computed
    by the ranks that own them: w13_local [E_local, 2I, H] and w2_local [E_local, H, I] are this rank's."""
    world = dist.get_world_size(group)
    E_local = w13_local.shape[0]
    if E_local * world != num_experts:
        raise ValueError(f"expert_parallel: {world} ranks x {E_local} local experts != {num_experts} experts; "
                         f"give each rank num_experts // world_size experts")
    T, K = ids.shape
    owner = ids.reshape(-1).long() // E_local
    order = torch.argsort(owner, stable=True)               # pairs grouped by the rank that owns their expert
    send_counts = torch.bincount(owner, minlength=world)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    send, recv = send_counts.tolist(), recv_counts.tolist()

    x_in = _exchange(x[order // K], send, recv, group)
    w_in = _exchange(weights.reshape(-1)[order].float(), send, recv, group)
    ids_in = _exchange((ids.reshape(-1)[order] % E_local).to(torch.int32), send, recv, group)
    if ids_in.shape[0]:
        y_in = experts(x_in, w13_local, w2_local, w_in[:, None], ids_in[:, None], activation=activation)
    else:           # nothing to compute, but the exchanges' backward passes must run here too
        y_in = x_in * 0 + w_in[:, None].to(x_in.dtype) * 0
    y = _exchange(y_in, recv, send, group)
    per_pair = y.new_zeros((T * K, y.shape[1])).index_copy(0, order, y)
    return per_pair.view(T, K, -1).sum(1)
