"""Quantized expert weights: `QuantizedExperts` (one [E, N, K] weight tensor) and `quantize_experts`.

Two formats, both stored row by row so that any per-row operation on the
weight (the gate/up interleave, slicing experts) is the same operation on
its codes and scales:

* "int4" (W4A16, GPTQ/AWQ-style): 4-bit codes in groups of G along K,
  w = (q - zero) * scale, each row of each expert a little-endian u4 bit
  stream (`quant.pack`'s layout, so `quant.quantize`, `from_gptq` and
  `from_awq` weights stack into it); scales and zeros [E, N, K // G]
  float16/bfloat16, no zeros when symmetric (q - 8).
* "fp8" (e4m3): codes [E, N, K] float8_e4m3fn and float32 scales
  [E, N, cdiv(K, G)], w = q * scale. The three scale granularities are
  one layout: per tensor (one scale per expert) and per channel (one per
  row) have G = K and one scale column; DeepSeek-style 128 x 128 block
  scales have G = 128 and each row holds its block's scale
  (`from_fp8_blocks` expands a checkpoint's [E, N/128, K/128] scales).
  So the kernels read a BN x 1 block of scales per K step, never gather.

By default activations stay bf16 (or float16/float32): the kernels
(`quantized_mlp.py`) dequantize the weight codes in registers and multiply
on the bf16 tensor cores. That runs on every target (sm_80 included, which
has no fp8 tensor cores) and needs no per-token scales in the aligned rows.
fp8 weights can instead meet fp8 activations quantized per token and group
of 128 (DeepSeek-V3's W8A8, `fp8_mlp.py`, sm_89 and newer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .. import quant

FORMATS = ("int4", "fp8")
FP8_SCALES = ("tensor", "channel", "block")
FP8_MAX = 448.0         # e4m3's largest finite value
FP8_BLOCK = 128         # DeepSeek-V3's weight block


@dataclass(frozen=True)
class QuantizedExperts:
    """One expert weight tensor [E, N, K] (used as y = x @ W[e]^T), quantized (see the module docstring)."""

    qweight: torch.Tensor               # int4: uint8 [E, N, K // 2]; fp8: float8_e4m3fn [E, N, K]
    scales: torch.Tensor                # int4: [E, N, K // G] float16/bfloat16; fp8: float32 [E, N, cdiv(K, G)]
    zeros: Optional[torch.Tensor]       # int4 asymmetric: like scales; else None
    format: str
    group_size: int                     # G: elements of K per scale column

    @property
    def shape(self) -> tuple[int, int, int]:
        E, N, k = self.qweight.shape
        return E, N, k * 2 if self.format == "int4" else k

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    def to(self, device) -> "QuantizedExperts":
        move = (lambda t: None if t is None else t.to(device))
        return QuantizedExperts(move(self.qweight), move(self.scales), move(self.zeros), self.format, self.group_size)

    def dequantize(self, expert: Optional[int] = None) -> torch.Tensor:
        """W as float32 [E, N, K] (or expert `expert`'s [N, K]), on the weight's device: what the kernels
        multiply by (the tests' and the benchmark's reference)."""
        pick = (lambda t: t if expert is None or t is None else t[expert])
        K = self.shape[2]
        scale = pick(self.scales).float().repeat_interleave(self.group_size, -1)[..., :K]
        if self.format == "fp8":
            return pick(self.qweight).float() * scale
        packed = pick(self.qweight)                 # code 2j in the low nibble of byte j, code 2j + 1 in the high
        codes = torch.stack((packed & 15, packed >> 4), -1).reshape(*packed.shape[:-1], K).float()
        zero = 8.0 if self.zeros is None else pick(self.zeros).float().repeat_interleave(self.group_size, -1)
        return (codes - zero) * scale

    def expert(self, e: int) -> quant.QuantizedWeight:
        """Expert e's int4 weight as a `quant.QuantizedWeight` (e.g. for `quant_gemm`)."""
        zeros = None if self.zeros is None else self.zeros[e]
        return quant.QuantizedWeight(self.qweight[e], self.scales[e], zeros, None, 4, self.group_size)


def stack_int4(weights: list[quant.QuantizedWeight]) -> QuantizedExperts:
    """Per-expert 4-bit `quant.QuantizedWeight`s (`quant.quantize`, `from_gptq`, `from_awq`; one group size,
    no act order) as one int4 QuantizedExperts."""
    first = weights[0]
    for w in weights:
        if w.format != "int" or w.bits != 4 or w.perm is not None or w.group_size != first.group_size or \
                (w.zeros is None) != (first.zeros is None) or w.shape != first.shape or w.layout != "plain":
            raise ValueError("stack_int4: every expert must be a 4-bit integer weight of one shape and group size, "
                             "all with or all without zeros, no act order and the plain code layout (repack with "
                             "quant.pack, no g_idx; w.with_layout('plain') undoes the fragment order)")
    zeros = None if first.zeros is None else torch.stack([w.zeros for w in weights])
    return QuantizedExperts(torch.stack([w.qweight for w in weights]), torch.stack([w.scales for w in weights]),
                            zeros, "int4", first.group_size)


def from_fp8_blocks(qweight: torch.Tensor, block_scales: torch.Tensor, block: int = FP8_BLOCK) -> QuantizedExperts:
    """A DeepSeek-V3-style checkpoint's fp8 experts (float8_e4m3fn [E, N, K] and float32 `weight_scale_inv`
    [E, cdiv(N, block), cdiv(K, block)]) as QuantizedExperts: each row gets its block's scales."""
    E, N, K = qweight.shape
    if qweight.dtype != torch.float8_e4m3fn:
        raise ValueError(f"from_fp8_blocks: qweight must be float8_e4m3fn, got {qweight.dtype}")
    expected = (E, -(-N // block), -(-K // block))
    if tuple(block_scales.shape) != expected:
        raise ValueError(f"from_fp8_blocks: block_scales must be [E, cdiv(N, {block}), cdiv(K, {block})] = "
                         f"{list(expected)}, got {list(block_scales.shape)}")
    rows = block_scales.float().repeat_interleave(block, 1)[:, :N].contiguous()
    return QuantizedExperts(qweight.contiguous(), rows, None, "fp8", block)


def quantize_experts(w: torch.Tensor, format: str = "int4", *, group_size: int = 128, symmetric: bool = True,
                     scale_dtype: torch.dtype = torch.bfloat16, scales: str = "block",
                     block: int = FP8_BLOCK) -> QuantizedExperts:
    """Round-to-nearest quantization of expert weights w [E, N, K].

    int4: groups of `group_size` along K, `symmetric` or with zeros, scales
    in `scale_dtype` (`quant.quantize`'s rounding, in torch on w's device). fp8: e4m3 codes with
    `scales` "tensor" (one per expert), "channel" (one per row) or "block"
    (`block` x `block` tiles: DeepSeek-V3's 128; a multiple of the GEMMs' BK)."""
    if w.dim() != 3:
        raise ValueError(f"quantize_experts: w must be [experts, N, K], got {tuple(w.shape)}")
    if format == "int4":
        return _quantize_int4(w, group_size, symmetric, scale_dtype)
    if format != "fp8":
        raise ValueError(f"quantize_experts: format must be one of {FORMATS}, got {format!r}")
    if scales not in FP8_SCALES:
        raise ValueError(f"quantize_experts: fp8 scales must be one of {FP8_SCALES}, got {scales!r}")
    E, N, K = w.shape
    w = w.float()
    if scales == "block":
        padded = torch.nn.functional.pad(w, (0, -K % block, 0, -N % block))
        tiles = padded.reshape(E, padded.shape[1] // block, block, padded.shape[2] // block, block)
        block_scales = tiles.abs().amax((2, 4)).clamp(min=1e-12) / FP8_MAX
        row_scales = block_scales.repeat_interleave(block, 1)[:, :N]
        codes = (w / row_scales.repeat_interleave(block, 2)[..., :K]).to(torch.float8_e4m3fn)
        return from_fp8_blocks(codes, block_scales, block)
    amax = w.abs().amax((1, 2), keepdim=True) if scales == "tensor" else w.abs().amax(2, keepdim=True)
    row_scales = (amax.clamp(min=1e-12) / FP8_MAX).expand(E, N, 1).contiguous()
    return QuantizedExperts((w / row_scales).to(torch.float8_e4m3fn), row_scales, None, "fp8", K)


def _quantize_int4(w: torch.Tensor, group_size: int, symmetric: bool, scale_dtype: torch.dtype) -> QuantizedExperts:
    """`quant.quantize`'s round to nearest (4 bits), in torch on w's device, packed as `quant.pack` packs."""
    E, N, K = w.shape
    if K % group_size or group_size % 2:
        raise ValueError(f"quantize_experts: K ({K}) must be a multiple of group_size ({group_size}), and the group "
                         f"size even; pick a group size that divides it")
    groups = w.float().reshape(E, N, K // group_size, group_size)
    if symmetric:
        scale, zero = groups.abs().amax(-1).clamp(min=1e-8) / 7.5, None
        codes = (groups / scale[..., None] + 8).round().clamp(0, 15)
    else:
        low, high = groups.amin(-1), groups.amax(-1)
        scale = ((high - low) / 15).clamp(min=1e-8)
        zero = (-low / scale).round().clamp(0, 15)
        codes = (groups / scale[..., None] + zero[..., None]).round().clamp(0, 15)
    codes = codes.reshape(E, N, K // 2, 2).to(torch.uint8)
    packed = codes[..., 0] | (codes[..., 1] << 4)
    return QuantizedExperts(packed, scale.to(scale_dtype), None if zero is None else zero.to(scale_dtype), "int4",
                            group_size)


def interleave(gate: QuantizedExperts, up: QuantizedExperts) -> QuantizedExperts:
    """Quantized gate and up weights [E, I, H] -> the [E, 2I, H] interleaved rows gate_up reads (like
    `interleave_gate_up`: every tensor here is stored by rows, so interleaving its rows is exact)."""
    if gate.shape != up.shape or gate.format != up.format or gate.group_size != up.group_size or \
            (gate.zeros is None) != (up.zeros is None):
        raise ValueError("moe.quantized.interleave: gate and up must be quantized alike (format, shape, group "
                         "size, zeros)")

    def rows(a, b):
        return None if a is None else torch.stack((a, b), 2).reshape(a.shape[0], 2 * a.shape[1], *a.shape[2:])

    return QuantizedExperts(rows(gate.qweight, up.qweight), rows(gate.scales, up.scales), rows(gate.zeros, up.zeros),
                            gate.format, gate.group_size)
