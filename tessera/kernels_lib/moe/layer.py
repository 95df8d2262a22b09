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
DeepSeek-V3's `gate.e_score_correction_bias` and `shared_experts.*`.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import nn

from .mlp import experts, interleave_gate_up
from .quantized import QuantizedExperts, interleave, quantize_experts
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
    `atomic` picks the atomic top-k sum over the deterministic one.
    `quantize_experts("int4" | "fp8", ...)` swaps w13 and w2 for
    quantized weights (inference).
    """

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int, *,
                 scoring: str = "softmax", renormalize: bool = True, n_group: int = 1, topk_group: int = 1,
                 scaling_factor: float = 1.0, correction_bias: bool = False, activation: str = "silu",
                 atomic: bool = False, shared_experts: Optional[nn.Module] = None,
                 dtype: Optional[torch.dtype] = None, device=None):
        super().__init__()
        factory = dict(dtype=dtype, device=device)
        self.num_experts, self.top_k, self.activation, self.atomic = num_experts, top_k, activation, atomic
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
        weights, ids, counts, chunk_counts = route(logits.detach(), self.top_k,
                                                   bias=self.e_score_correction_bias, **self.routing)
        probs = self._scores(logits)
        if torch.is_grad_enabled() and logits.requires_grad:     # let gradients reach the router
            weights = self._weights(probs, ids)
        out = experts(x2, self.w13, self.w2, weights, ids, activation=self.activation, atomic=self.atomic,
                      counts=counts, chunk_counts=chunk_counts)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x2)
        out = out.reshape(shape)
        return (out, Routing(probs, ids, counts)) if return_routing else out

    def quantize_experts(self, format: str = "int4", **options) -> "MoELayer":
        """Replace w13 and w2 by quantized copies, for inference: int4 (W4A16, group-wise) or fp8 (e4m3, per
        tensor, channel or 128 x 128 block); `options` are `quantized.quantize_experts`'. Gate and up are
        quantized separately (as checkpoints are) and then interleaved. Returns the layer."""
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
                        **options) -> "MoELayer":
        """A layer holding a checkpoint's MoE block weights (`state`: the block's state dict, keys without the
        block's prefix) for `style` "mixtral", "qwen3" or "deepseek_v3"; `options` override STYLES' routing."""
        if style not in STYLES:
            raise ValueError(f"MoELayer.from_state_dict: style must be one of {sorted(STYLES)}, got {style!r}")
        gate_name, up_name, down_name = _EXPERT_NAMES[style]
        router = state["gate.weight"]
        E, H = router.shape
        stacked = {n: torch.stack([state[f"experts.{i}.{n}.weight"] for i in range(E)])
                   for n in (gate_name, up_name, down_name)}
        I = stacked[gate_name].shape[1]
        layer = cls(H, I, E, top_k, **{**STYLES[style], **options}, shared_experts=shared_experts,
                    dtype=stacked[gate_name].dtype, device=router.device)
        with torch.no_grad():
            layer.gate.weight.copy_(router)
            layer.w13.copy_(interleave_gate_up(stacked[gate_name], stacked[up_name]))
            layer.w2.copy_(stacked[down_name])
            if layer.e_score_correction_bias is not None:
                layer.e_score_correction_bias.copy_(state["gate.e_score_correction_bias"])
        if shared_experts is not None:          # its weights, where the checkpoint has them
            prefix = "shared_experts."
            shared = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
            if shared:
                shared_experts.load_state_dict(shared)
        return layer
