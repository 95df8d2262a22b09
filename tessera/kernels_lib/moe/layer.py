"""`MoELayer`: a routed mixture-of-experts MLP block (Mixtral, DeepSeek-V3, Qwen3-MoE) on Tessera's kernels.

forward(x): router logits = x @ gate^T -> `route` -> `experts` (+ the
shared experts' MLP, DeepSeek). The routing kernel chooses the experts;
when the router is being trained, the chosen experts' weights are
recomputed from the logits in torch so that gradients reach the router
(the choice itself has none). `forward(x, return_routing=True)` also
returns the router probabilities, expert ids and tokens per expert that
`load_balancing_loss` takes.

Weights come from checkpoints by their usual names (`from_state_dict`):
Mixtral's `gate.weight`, `experts.{i}.w1/w2/w3.weight`; Qwen3-MoE's and
DeepSeek-V3's `experts.{i}.gate_proj/up_proj/down_proj.weight`, and
DeepSeek-V3's `gate.e_score_correction_bias` and `shared_experts.*`;
quantized experts too (DeepSeek-V3's fp8 `weight_scale_inv`, GPTQ, AWQ).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import nn

from .mlp import experts, interleave_gate_up
from .persistent import moe_layer
from .. import quant
from .quantized import QuantizedExperts, from_fp8_blocks, interleave, quantize_experts, stack_int4
from .routing import route

STYLES = {      # the routing each model family uses (its config's values for the flagship model)
    "mixtral": dict(scoring="softmax", renormalize=True),
    "qwen3": dict(scoring="softmax", renormalize=True),           # norm_topk_prob = True
    "deepseek_v3": dict(scoring="sigmoid", renormalize=True, n_group=8, topk_group=4, scaling_factor=2.5,
                        correction_bias=True),
}
_EXPERT_NAMES = {"mixtral": ("w1", "w3", "w2"), "qwen3": ("gate_proj", "up_proj", "down_proj"),
                 "deepseek_v3": ("gate_proj", "up_proj", "down_proj")}


class Routing(NamedTuple):
    """What the router decided: probabilities [T, E] (differentiable), expert ids [T, k], tokens per expert [E]."""

    probs: torch.Tensor
    ids: torch.Tensor
    counts: torch.Tensor


class MoELayer(nn.Module):
    """Top-k routed experts: out = sum_j w_j * down_j(act(gate_j(x)) * up_j(x)) (+ shared experts).

    Parameters: `gate` (the router, [E, H]), `w13` ([E, 2I, H], gate and
    up rows interleaved: `interleave_gate_up`), `w2` ([E, H, I]), and with
    `correction_bias` the buffer `e_score_correction_bias` [E] (DeepSeek-V3;
    it steers the choice, not the weights). Routing options are `route`'s;
    `atomic` picks the atomic top-k sum over the deterministic one;
    `one_launch` runs routing and experts in one persistent kernel
    (inference only; `persistent.py`).
    `quantize_experts("int4" | "fp8", ...)` swaps w13 and w2 for
    frozen quantized weights (inference, or fine-tuning the router and
    what feeds the layer: gradients reach x and the routing weights).
    """

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int, *,
                 scoring: str = "softmax", renormalize: bool = True, n_group: int = 1, topk_group: int = 1,
                 scaling_factor: float = 1.0, correction_bias: bool = False, activation: str = "silu",
                 atomic: bool = False, one_launch: bool = False, shared_experts: Optional[nn.Module] = None,
                 dtype: Optional[torch.dtype] = None, device=None):
        super().__init__()
        factory = dict(dtype=dtype, device=device)
        self.num_experts, self.top_k, self.activation, self.atomic = num_experts, top_k, activation, atomic
        self.one_launch = one_launch
        self.fp8_activations = False
        self.routing = dict(scoring=scoring, renormalize=renormalize, n_group=n_group, topk_group=topk_group,
                            scaling_factor=scaling_factor)
        self.gate = nn.Linear(hidden_size, num_experts, bias=False, **factory)
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size, **factory))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size, **factory))
        bias = torch.zeros(num_experts, dtype=torch.float32, device=device) if correction_bias else None
        self.register_buffer("e_score_correction_bias", bias)
        self.shared_experts = shared_experts
        nn.init.normal_(self.w13, std=hidden_size ** -0.5)
        nn.init.normal_(self.w2, std=intermediate_size ** -0.5)

    def forward(self, x: torch.Tensor, return_routing: bool = False):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        logits = self.gate(x2)
        if self.one_launch:
            return self._forward_one_launch(x2, logits, shape, return_routing)
        weights, ids, counts, chunk_counts = route(logits.detach(), self.top_k,
                                                   bias=self.e_score_correction_bias, **self.routing)
        probs = self._scores(logits)
        trainable = not self.fp8_activations        # W8A8 is inference only; frozen int4/fp8 experts train the rest
        if torch.is_grad_enabled() and logits.requires_grad and trainable:     # let gradients reach the router
            weights = self._weights(probs, ids)
        out = experts(x2, self.w13, self.w2, weights, ids, activation=self.activation, atomic=self.atomic,
                      counts=counts, chunk_counts=chunk_counts, fp8_activations=self.fp8_activations)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x2)
        out = out.reshape(shape)
        return (out, Routing(probs, ids, counts)) if return_routing else out

    def _forward_one_launch(self, x2: torch.Tensor, logits: torch.Tensor, shape, return_routing: bool):
        """Routing and experts in one persistent launch (`persistent.moe_layer`; inference only)."""
        if isinstance(self.w13, QuantizedExperts):
            raise ValueError("MoELayer(one_launch=True) takes float expert weights; quantized experts run with "
                             "one_launch=False")
        out, _, ids, counts = moe_layer(x2, self.w13, self.w2, logits, self.top_k,
                                        bias=self.e_score_correction_bias, activation=self.activation,
                                        atomic=self.atomic, **self.routing)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x2)
        out = out.reshape(shape)
        return (out, Routing(self._scores(logits), ids, counts)) if return_routing else out

    def quantize_experts(self, format: str = "int4", *, fp8_activations: bool = False, **options) -> "MoELayer":
        """Replace w13 and w2 by frozen quantized copies (inference; gradients still reach x and the router):
        int4 (W4A16, group-wise) or fp8 (e4m3, per tensor, channel or 128 x 128 block); `options` are
        `quantized.quantize_experts`'. Gate and up are quantized separately (as checkpoints are) and then
        interleaved. `fp8_activations` (fp8 weights, sm_89+)
        multiplies fp8 activations quantized per token group (`fp8_mlp.py`, inference only). Returns the layer."""
        self.fp8_activations = fp8_activations
        with torch.no_grad():
            gate, up = self.w13[:, 0::2], self.w13[:, 1::2]
            q13 = interleave(quantize_experts(gate, format, **options), quantize_experts(up, format, **options))
            q2 = quantize_experts(self.w2, format, **options)
        return self.load_quantized_experts(q13, q2)

    def load_quantized_experts(self, w13: QuantizedExperts, w2: QuantizedExperts) -> "MoELayer":
        """Use already quantized expert weights (e.g. a DeepSeek-V3 fp8 checkpoint's, through
        `quantized.from_fp8_blocks` and `quantized.interleave`) in place of the w13 and w2 parameters. They are
        plain attributes: `.to(device)` and `state_dict` do not see them."""
        E, two_i, H = w13.shape
        if E != self.num_experts or H != self.gate.in_features or w2.shape != (E, H, two_i // 2):
            raise ValueError(f"MoELayer.load_quantized_experts: w13 must be [{self.num_experts}, 2I, "
                             f"{self.gate.in_features}] and w2 [{self.num_experts}, {self.gate.in_features}, I], "
                             f"got {w13.shape} and {w2.shape}")
        for name in ("w13", "w2"):
            if name in self._parameters:
                del self._parameters[name]
        self.w13, self.w2 = w13, w2
        return self

    def _scores(self, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.float()
        return logits.softmax(-1) if self.routing["scoring"] == "softmax" else logits.sigmoid()

    def _weights(self, probs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The chosen experts' weights, as the routing kernel computes them, from differentiable scores."""
        weights = probs.gather(1, ids.long())
        if self.routing["renormalize"]:
            weights = weights / weights.sum(1, keepdim=True)
        return weights * self.routing["scaling_factor"]

    @classmethod
    def from_state_dict(cls, state: dict, style: str, top_k: int, *, shared_experts: Optional[nn.Module] = None,
                        quant_method: str = "gptq", **options) -> "MoELayer":
        """A layer holding a checkpoint's MoE block weights (`state`: the block's state dict, keys without the
        block's prefix) for `style` "mixtral", "qwen3" or "deepseek_v3"; `options` override STYLES' routing.

        Quantized experts load as frozen `QuantizedExperts`: fp8 weights
        with DeepSeek-V3's `weight_scale_inv` 128 x 128 block scales, or
        4-bit `qweight` / `qzeros` / `scales` of `quant_method` "gptq" or
        "awq"; the layer's dtype is then the router's."""
        if style not in STYLES:
            raise ValueError(f"MoELayer.from_state_dict: style must be one of {sorted(STYLES)}, got {style!r}")
        names = _EXPERT_NAMES[style]
        router = state["gate.weight"]
        E, H = router.shape
        quantized = _quantized_experts(state, E, names, quant_method)
        if quantized is None:
            stacked = [torch.stack([state[f"experts.{i}.{n}.weight"] for i in range(E)]) for n in names]
            I, dtype, device = stacked[0].shape[1], stacked[0].dtype, router.device
        else:       # no bf16 experts are allocated: built on the meta device, then only the router materialized
            I, dtype, device = quantized[1].shape[2], router.dtype, "meta"
        layer = cls(H, I, E, top_k, **{**STYLES[style], **options}, dtype=dtype, device=device)
        if quantized is not None:
            layer.load_quantized_experts(*(q.to(router.device) for q in quantized))
            layer.to_empty(device=router.device)
        with torch.no_grad():
            layer.gate.weight.copy_(router)
            if quantized is None:
                layer.w13.copy_(interleave_gate_up(stacked[0], stacked[1]))
                layer.w2.copy_(stacked[2])
            if layer.e_score_correction_bias is not None:
                layer.e_score_correction_bias.copy_(state["gate.e_score_correction_bias"])
        layer.shared_experts = shared_experts
        if shared_experts is not None:          # its weights, where the checkpoint has them
            prefix = "shared_experts."
            shared = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
            if shared:
                shared_experts.load_state_dict(shared)
        return layer


def _quantized_experts(state: dict, E: int, names, quant_method: str):
    """A checkpoint's quantized experts as (w13, w2) QuantizedExperts, or None when they are plain weights."""
    first = f"experts.0.{names[0]}"
    if f"{first}.weight_scale_inv" in state:
        def load(n):
            return from_fp8_blocks(*(torch.stack([state[f"experts.{i}.{n}.{t}"] for i in range(E)])
                                     for t in ("weight", "weight_scale_inv")))
    elif f"{first}.qweight" in state:
        if quant_method not in ("gptq", "awq"):
            raise ValueError(f"MoELayer.from_state_dict: quant_method must be 'gptq' or 'awq', got {quant_method!r}")

        def load(n):
            return stack_int4([_int4_expert(state, f"experts.{i}.{n}", quant_method) for i in range(E)])
    else:
        return None
    return interleave(load(names[0]), load(names[1])), load(names[2])


def _int4_expert(state: dict, prefix: str, quant_method: str) -> quant.QuantizedWeight:
    """One expert projection's GPTQ or AWQ tensors as a `quant.QuantizedWeight`; the group size is K over the
    scales' rows. Act-order GPTQ weights (a g_idx that is not k // G) are refused: the grouped GEMMs read K in
    order."""
    qweight, qzeros, scales = (state[f"{prefix}.{t}"].cpu() for t in ("qweight", "qzeros", "scales"))
    K = qweight.shape[0] * (8 if quant_method == "gptq" else 1)
    group = K // scales.shape[0]
    if quant_method == "awq":
        return quant.from_awq(qweight, qzeros, scales, group_size=group)
    g_idx = state.get(f"{prefix}.g_idx")
    if g_idx is not None and not torch.equal(g_idx.long().cpu(), torch.arange(K) // group):
        raise ValueError(f"MoELayer.from_state_dict: {prefix} is act-order GPTQ (desc_act); the MoE kernels need "
                         f"groups in K order: requantize without desc_act")
    return quant.from_gptq(qweight, qzeros, scales, bits=4, group_size=group)
