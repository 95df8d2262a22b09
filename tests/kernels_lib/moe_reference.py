"""Float64 references for the MoE tests: routing, alignment and the expert MLPs, written the plain way."""

from __future__ import annotations

import numpy as np
import torch


def route(logits, top_k, scoring="softmax", bias=None, n_group=1, topk_group=1, renormalize=True, scale=1.0):
    """(weights, ids) as DeepSeek's / vLLM's grouped_topk and Mixtral's softmax-topk define them; ties go to
    the lower index (stable sorts)."""
    x = np.asarray(logits, np.float64)
    T, E = x.shape
    if scoring == "softmax":
        e = np.exp(x - x.max(1, keepdims=True))
        scores = e / e.sum(1, keepdims=True)
    else:
        scores = 1 / (1 + np.exp(-x))
    choice = scores + (0 if bias is None else np.asarray(bias, np.float64))
    if n_group > 1:
        grouped = choice.reshape(T, n_group, E // n_group)
        group_scores = np.sort(grouped, -1)[..., -2:].sum(-1) if bias is not None else grouped.max(-1)
        best = np.argsort(-group_scores, 1, kind="stable")[:, :topk_group]
        keep = np.zeros((T, n_group), bool)
        np.put_along_axis(keep, best, True, 1)
        choice = np.where(np.repeat(keep, E // n_group, 1), choice, -np.inf)
    ids = np.argsort(-choice, 1, kind="stable")[:, :top_k]
    weights = np.take_along_axis(scores, ids, 1)
    if renormalize:
        weights = weights / weights.sum(1, keepdims=True)
    return weights * scale, ids


def align(ids, num_experts, block_m):
    """moe_align_block_size: the pairs of each expert in order, each run padded to block_m; block experts."""
    flat = np.asarray(ids).reshape(-1)
    rows, experts = [], []
    for e in range(num_experts):
        mine = np.flatnonzero(flat == e).tolist()
        if mine:
            padded = -(-len(mine) // block_m) * block_m
            rows += mine + [flat.size] * (padded - len(mine))
            experts += [e] * (padded // block_m)
    return np.array(rows, np.int64), np.array(experts, np.int64)


def activation(gate, kind):
    if kind == "silu":
        return gate / (1 + np.exp(-gate))
    return 0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate ** 3)))


def experts(x, w13, w2, weights, ids, kind="silu"):
    """sum over k of weights[t, k] * down_e(act(gate_e(x_t)) * up_e(x_t)), e = ids[t, k], in float64."""
    x, w13, w2 = (np.asarray(t, np.float64) for t in (x, w13, w2))
    inter = w2.shape[2]
    out = np.zeros((x.shape[0], w2.shape[1]))
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            h = w13[e] @ x[t]
            out[t] += float(weights[t, k]) * (w2[e] @ (activation(h[:inter], kind) * h[inter:]))
    return out


def as64(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()
