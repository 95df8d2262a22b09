"""The MoE layers bench/moe.py measures tessera against: torch routing, a loop over experts, torch._grouped_mm,
and Triton's fused_experts from vLLM or SGLang when one is installed. Weights: w13 [E, 2I, H] (gate rows, then
up rows), w2 [E, H, I]; routing: weights and ids [T, k]."""

from __future__ import annotations


def topk(torch, logits, k: int, bias=None, scoring: str = "softmax", n_group: int = 1, topk_group: int = 1,
         scaling_factor: float = 1.0):
    """(weights, ids) as Mixtral / Qwen3 (softmax, top-k, renormalized) and DeepSeek-V3 (sigmoid, biased
    choice within the best groups, renormalized, scaled) route, in torch."""
    scores = logits.float().softmax(-1) if scoring == "softmax" else logits.float().sigmoid()
    choice = scores if bias is None else scores + bias
    if n_group > 1:
        T, E = choice.shape
        grouped = choice.view(T, n_group, E // n_group)
        group_scores = grouped.topk(2, -1).values.sum(-1) if bias is not None else grouped.amax(-1)
        keep = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(topk_group, -1).indices, 1.0)
        choice = choice.masked_fill(keep.repeat_interleave(E // n_group, 1) == 0, float("-inf"))
    ids = choice.topk(k, -1).indices
    weights = scores.gather(1, ids)
    return weights / weights.sum(-1, keepdim=True) * scaling_factor, ids.to(torch.int32)


def loop_layer(torch, x, w13, w2, weights, ids):
    """For each expert: its tokens, act(gate) * up, down, weighted, added into their rows (the reference)."""
    I = w2.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in range(w13.shape[0]):
        token, slot = torch.nonzero(ids == e, as_tuple=True)
        if token.numel() == 0:
            continue
        h = x[token] @ w13[e].t()
        inner = torch.nn.functional.silu(h[:, :I].float()) * h[:, I:].float()
        y = (inner.to(x.dtype) @ w2[e].t()).float() * weights[token, slot, None].float()
        out.index_add_(0, token, y)
    return out.to(x.dtype)


def expert_ends(torch, ids, num_experts: int):
    """The end row of each expert's range in the expert-sorted order (int32 [E], on ids' device), counted on
    the device: `torch.bincount` on CUDA reads the ids' min and max back to the host (two syncs per call),
    which a CUDA graph cannot capture; a scatter-add of ones has a fixed output size and never syncs."""
    flat = ids.reshape(-1).long()
    counts = torch.zeros(num_experts, dtype=torch.int64, device=ids.device)
    return counts.scatter_add_(0, flat, torch.ones_like(flat)).cumsum(0).to(torch.int32)


def grouped_mm_layer(torch, x, w13, w2, weights, ids):
    """Tokens sorted by expert, then two torch._grouped_mm calls over the experts' row ranges; every step on
    the device, so the layer is captured whole in a CUDA graph (routing to output)."""
    T, K = ids.shape
    I = w2.shape[2]
    order = ids.reshape(-1).argsort(stable=True)
    ends = expert_ends(torch, ids, w13.shape[0])
    h = torch._grouped_mm(x[order // K], w13.transpose(1, 2), offs=ends)
    inner = (torch.nn.functional.silu(h[:, :I].float()) * h[:, I:].float()).to(x.dtype)
    y = torch._grouped_mm(inner, w2.transpose(1, 2), offs=ends).float()
    y = y * weights.reshape(-1)[order, None].float()
    return torch.zeros((T, x.shape[1]), dtype=torch.float32, device=x.device).index_add_(0, order // K, y).to(x.dtype)


def triton_fused_experts():
    """fused_experts(x, w13, w2, weights, ids) from vLLM or SGLang (Triton kernels), or None."""
    try:
        from vllm.model_executor.layers.fused_moe import fused_experts
    except Exception:
        try:
            from sglang.srt.layers.moe.fused_moe_triton.fused_moe import fused_experts
        except Exception:
            return None
    return lambda x, w13, w2, weights, ids: fused_experts(x, w13, w2, weights, ids)
