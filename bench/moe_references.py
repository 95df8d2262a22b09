"""The MoE layers bench/moe.py measures tessera against: torch routing, a loop over experts, torch._grouped_mm,
and Triton's fused_experts from vLLM or SGLang when one is installed. Weights: w13 [E, 2I, H] (gate rows, then
up rows), w2 [E, H, I]; routing: weights and ids [T, k]."""

from __future__ import annotations

from tessera.testing import FP8_MMA_RELATIVE_ERROR


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


# -- W8A8: fp8 activations and weights, quantized exactly as tessera's op quantizes them -------------------

FP8_MAX = 448.0
ACCUMULATOR = FP8_MMA_RELATIVE_ERROR     # relative error of a gate/up value from the fp8 tensor cores' accumulation
FLIP = 4 * ACCUMULATOR / 2.0 ** -3.5    # chance that h (relative error <= 2x that of g and u) crosses an e4m3
                                        # rounding boundary (the codes are 2^-3 to 2^-4 of their value apart)
SIGMAS = 6.0


def fp8_rows(torch, a, group: int):
    """(codes as float64, float32 scales [n, groups]) of a [n, H] quantized per row and group of `group` columns
    as `fp8_mlp.quantize_tokens_kernel` does: scale = max(amax, 1e-12) / 448 and codes = e4m3(a / scale), both in
    float32 (division and rounding to nearest even, as the kernel's div.rn and cvt.rn)."""
    n, H = a.shape
    padded = torch.nn.functional.pad(a.float(), (0, -H % group)).reshape(n, -1, group)
    scale = padded.abs().amax(-1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    codes = (padded / scale).to(torch.float8_e4m3fn).double()
    return codes.reshape(n, -1)[:, :H], scale[..., 0]


def _spread(torch, scale, group: int, H: int):
    return scale.double().repeat_interleave(group, -1)[..., :H]


def fp8_ulp(torch, codes):
    """One e4m3 step at each code (2^(e - 3) in a binade 2^e; 2^-9 below the smallest normal, 2^-6)."""
    exponent = torch.floor(torch.log2(codes.abs().clamp(min=2.0 ** -6)))
    return torch.exp2(exponent - 3)


def dequantized64(torch, q, e: int):
    """Expert e of QuantizedExperts q (fp8) in float64: codes times their scales, with no rounding between."""
    K = q.shape[2]
    return q.qweight[e].double() * q.scales[e].double().repeat_interleave(q.group_size, -1)[:, :K]


def w8a8_layer(torch, x, q13, q2, weights, ids, group: int = 128):
    """(expected, allowance) [T, H] float64 for `experts(x, q13, q2, weights, ids, fp8_activations=True)` (SiLU):
    x quantized per token and group, h = bf16(silu(g) * u) quantized the same way, both GEMMs in float64 over
    the dequantized codes. The op and this then differ only in accumulation order, and the allowance bounds
    what that can do to each output element: SIGMAS standard deviations of two random errors, summed in
    quadrature over the i of h @ w2^T and over the slots -- a relative ACCUMULATOR error of each product (3x:
    down's own, and g's and u's through h) and an h code one e4m3 step off (chance FLIP each) -- plus the
    bf16 roundings of each slot's y and of the output."""
    T, H = x.shape
    xq, x_scale = fp8_rows(torch, x, group)
    xd = xq * _spread(torch, x_scale, group, H)
    expected = torch.zeros((T, H), dtype=torch.float64, device=x.device)
    variance, rounding = torch.zeros_like(expected), torch.zeros_like(expected)
    for e in range(q13.shape[0]):
        token, slot = torch.nonzero(ids == e, as_tuple=True)
        if token.numel() == 0:
            continue
        w13, w2 = dequantized64(torch, q13, e), dequantized64(torch, q2, e)
        pre = xd[token] @ w13.t()                                  # interleaved: gate, up, gate, ...
        g, u = pre[:, 0::2], pre[:, 1::2]
        h = (torch.nn.functional.silu(g) * u).to(torch.bfloat16)  # the op stores h in bf16, then quantizes it
        hq, h_scale = fp8_rows(torch, h, group)
        scale = _spread(torch, h_scale, group, hq.shape[1])
        hd, step = hq * scale, fp8_ulp(torch, hq) * scale
        w = weights[token, slot, None].double()
        y = (hd @ w2.t()) * w
        squares = ((3 * ACCUMULATOR) ** 2 * hd ** 2 + FLIP * step ** 2) @ (w2 ** 2).t()
        expected.index_add_(0, token, y)
        variance.index_add_(0, token, squares * w ** 2)
        rounding.index_add_(0, token, 2.0 ** -9 * y.abs())
    return expected, SIGMAS * variance.sqrt() + rounding + 2.0 ** -8 * expected.abs()
