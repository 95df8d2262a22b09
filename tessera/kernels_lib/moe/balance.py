"""The auxiliary load-balancing loss of MoE training, per micro-batch or over the global batch.

loss = E * sum_i f_i * P_i (Switch Transformer, Mixtral): f_i is the
fraction of (token, slot) assignments that went to expert i and P_i the
mean router probability of expert i. It is smallest when both are uniform.
Gradients flow through P (the probabilities); f is a count.

A micro-batch of a few thousand tokens is too small to ask every expert
to be balanced in it, which pushes experts toward uniformity instead of
specialization. The global-batch variant (Qiu et al., "Demons in the
Detail", 2025) counts f over every micro-batch of a data-parallel step:
the per-expert counts are all-reduced over the process group -- one
all-reduce of an E-vector -- while P stays local.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist


def load_balancing_loss(router_probs: torch.Tensor, expert_ids: torch.Tensor, num_experts: int,
                        group: Optional["dist.ProcessGroup"] = None, *,
                        counts: Optional[torch.Tensor] = None) -> torch.Tensor:
    """E * sum_i f_i * P_i for router probabilities [T, E] and the chosen expert ids [T, k].

    With `group` (a torch.distributed process group, or `dist.group.WORLD`),
    f is the global batch's: the counts are all-reduced over the group.
    `counts` ([E] int, `route`'s) saves counting the ids again.
    Differentiable in router_probs.
    """
    if router_probs.dim() != 2 or router_probs.shape[1] != num_experts:
        raise ValueError(f"load_balancing_loss: router_probs must be [tokens, {num_experts}], got "
                         f"{tuple(router_probs.shape)}")
    if expert_ids.dim() != 2 or expert_ids.shape[0] != router_probs.shape[0]:
        raise ValueError(f"load_balancing_loss: expert_ids must be [{router_probs.shape[0]}, top_k], got "
                         f"{tuple(expert_ids.shape)}")
    if counts is None:
        counts = torch.bincount(expert_ids.reshape(-1).long(), minlength=num_experts)
    counts = counts.to(torch.float32)
    if group is not None:
        if not dist.is_initialized():
            raise ValueError("load_balancing_loss: group is given but torch.distributed is not initialized; call "
                             "dist.init_process_group first, or pass group=None for the micro-batch loss")
        dist.all_reduce(counts, group=group)
    f = counts / counts.sum().clamp(min=1)
    return num_experts * (f * router_probs.float().mean(0)).sum()
