"""Quantized weights as the `quant_gemm` kernels read them, and importers from GPTQ and AWQ checkpoints.

A weight W (N x K, used as y = x @ W^T) is quantized in groups of G
consecutive elements along K: `w[n, k] = (q[n, k] - z[n, g]) * s[n, g]` with
g = k // G, codes q of `bits` bits (unsigned; symmetric formats have no z
and subtract 2^(bits-1)). `pack` lays it out for the kernels:

* the codes of each row of W are one little-endian bit stream along K
  (`tessera.u4` etc. in the kernels' view of a uint8 tensor), so each
  thread of a kernel reads 128 contiguous bits of K with one load and
  unpacks them in registers (the low-bit pass);
* scales and zeros are [N, K // G] (float16 or bfloat16);
* act-order checkpoints (GPTQ `g_idx`) are re-laid out offline: K is
  permuted so that every group is contiguous (`perm`), and the op reads
  the activations' columns in that order, x[:, perm];
* MXFP4 / NVFP4 weights store fp4 (e2m1) codes and e8m0 (group 32) or e4m3
  (group 16, plus one float32 `global_scale`) scale bits.

`layout="fragment"` (integer codes; NVIDIA's decode kernel) stores the same
bytes in another order: each (64, 128) block of W as 128 runs of 32 codes,
one per thread, in the order that thread's mma.sync B-fragment registers
take them (`quant_fragment`), so the kernel loads them with 128-bit loads
straight into registers. `preferred_layout(device)` says which a device
wants; `QuantizedWeight.with_layout` converts.

`from_gptq` and `from_awq` unpack the int32 tensors of those formats
(GPTQ: qweight [K/8, N] packed along K, qzeros [K/G, N/8] stored as zero-1;
AWQ: qweight [K, N/8] packed along N in nibble order 0,2,4,6,1,3,5,7).
`quantize` is round-to-nearest quantization, for tests and benchmarks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

import tessera

from .quant_fragment import DECODE_TILING

INT_TYPES = {bits: getattr(tessera, f"u{bits}") for bits in range(1, 8)} | {8: tessera.u8}
FORMATS = ("int", "mxfp4", "nvfp4")
LAYOUTS = ("plain", "fragment")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)        # AWQ: nibble j of a packed int32 holds column 8c + AWQ_ORDER[j]


@dataclass(frozen=True)
class QuantizedWeight:
    """A packed weight for `quant_gemm` (see the module docstring)."""

    qweight: torch.Tensor               # uint8 [N, K * bits // 8]: each row's codes as a bit stream
    scales: torch.Tensor                # [N, K // G]: float16/bfloat16, or uint8 e8m0 / e4m3 bits (mxfp4, nvfp4)
    zeros: Optional[torch.Tensor]       # [N, K // G] like float scales, or None (symmetric)
    perm: Optional[torch.Tensor]        # int64 [K] (act order): the kernels multiply x[:, perm]
    bits: int
    group_size: int
    format: str = "int"
    global_scale: float = 1.0           # nvfp4's per-tensor scale
    layout: str = "plain"               # "fragment": qweight's codes in DECODE_TILING's fragment order

    @property
    def shape(self) -> tuple[int, int]:
        return self.qweight.shape[0], self.qweight.shape[1] * 8 // self.bits

    @property
    def code_dtype(self) -> tessera.DType:
        """The tessera type the kernels read the codes as."""
        return tessera.f4e2m1 if self.format != "int" else INT_TYPES[self.bits]

    def codes(self) -> torch.Tensor:
        """The codes q as int64 [N, K] (bit patterns, for the fp4 formats)."""
        n, k = self.shape
        bits = np.unpackbits(self.qweight.cpu().numpy(), axis=1, bitorder="little").reshape(n, k, self.bits)
        codes = (bits.astype(np.int64) << np.arange(self.bits)).sum(-1)
        if self.layout == "fragment":
            tiling = DECODE_TILING
            stored = codes.reshape(n // tiling.BN, k // tiling.BK, tiling.threads, tiling.locals)
            codes = tiling.from_fragment_order(stored)
        return torch.from_numpy(codes)

    def to(self, device: torch.device | str) -> "QuantizedWeight":
        """This weight on `device`, its codes in the layout the kernels read fastest there (`preferred_layout`;
        "plain" where the fragment order does not fit the weight's shape or format)."""
        fits = self.format == "int" and DECODE_TILING.fits(*self.shape, self.group_size)
        w = self.with_layout(preferred_layout(device) if fits else "plain")
        moved = {name: t.to(device) for name in ("qweight", "scales", "zeros", "perm")
                 if (t := getattr(w, name)) is not None}
        return dataclasses.replace(w, **moved)

    def with_layout(self, layout: str) -> "QuantizedWeight":
        """The same weight with its codes stored in `layout` ("plain" or "fragment")."""
        if layout == self.layout:
            return self
        codes, perm = self.codes(), None if self.perm is None else self.perm.cpu()
        if perm is not None:            # pack permutes K by g_idx again: hand it the codes in W's own order
            codes = codes[:, torch.argsort(perm)]
        g_idx = None if perm is None else torch.argsort(perm) // self.group_size
        w = pack(codes, self.scales, self.zeros, bits=self.bits, group_size=self.group_size, g_idx=g_idx,
                 format=self.format, global_scale=self.global_scale, layout=layout)
        return dataclasses.replace(w, qweight=w.qweight.to(self.qweight.device),
                                   perm=None if w.perm is None else w.perm.to(self.perm.device))

    def dequantize(self) -> torch.Tensor:
        """W as float32 [N, K], in the original order of K (the reference the kernels are checked against)."""
        q = self.codes()
        if self.format == "int":
            zero = (self.zeros.float() if self.zeros is not None
                    else torch.full_like(self.scales, 2 ** (self.bits - 1), dtype=torch.float32))
            scale = self.scales.float()
            w = (q.float() - zero.repeat_interleave(self.group_size, 1)) * scale.repeat_interleave(self.group_size, 1)
        else:
            values = torch.from_numpy(tessera.f4e2m1.decode(q.numpy()).astype(np.float32))
            scale_dtype = tessera.e8m0 if self.format == "mxfp4" else tessera.f8e4m3
            scale = torch.from_numpy(scale_dtype.decode(self.scales.cpu().numpy()).astype(np.float32))
            w = values * scale.repeat_interleave(self.group_size, 1) * self.global_scale
        if self.perm is not None:
            w = w[:, torch.argsort(self.perm)]
        return w


def preferred_layout(device: torch.device | str) -> str:
    """The code layout the kernels read fastest on `device`: "fragment" on NVIDIA GPUs (the decode kernel's
    mma.sync fragments), "plain" on the CPU interpreter and AMD GPUs."""
    device = torch.device(device)
    return "fragment" if device.type == "cuda" and torch.version.hip is None else "plain"


def pack(codes: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor] = None, *, bits: int,
         group_size: int, g_idx: Optional[torch.Tensor] = None, format: str = "int",
         global_scale: float = 1.0, layout: str = "plain") -> QuantizedWeight:
    """Lay out codes [N, K] (ints in [0, 2^bits)) with scales / zeros [N, K // group_size] for the kernels.

    `g_idx` [K] (act order) gives each k's group; K is then permuted so that
    groups are contiguous (each group must have `group_size` members).
    `layout="fragment"` stores the codes in the decode kernel's mma fragment
    order (integer formats; N a multiple of 64, K of 128)."""
    if format not in FORMATS:
        raise ValueError(f"quant.pack: format must be one of {FORMATS}, got {format!r}")
    if layout not in LAYOUTS or (layout == "fragment" and format != "int"):
        raise ValueError(f"quant.pack: layout must be one of {LAYOUTS} ('fragment' for integer codes only), got "
                         f"layout={layout!r} for format={format!r}")
    bits = 4 if format != "int" else bits
    n, k = codes.shape
    if not 1 <= bits <= 8 or k % group_size or (k * bits) % 8:
        raise ValueError(f"quant.pack: need 1 <= bits <= 8, K ({k}) a multiple of group_size ({group_size}) and "
                         f"K * bits a whole number of bytes; got bits={bits}")
    if tuple(scales.shape) != (n, k // group_size) or (zeros is not None and zeros.shape != scales.shape):
        raise ValueError(f"quant.pack: scales (and zeros) must be [N, K // group_size] = [{n}, {k // group_size}], "
                         f"got {tuple(scales.shape)}" + (f" and {tuple(zeros.shape)}" if zeros is not None else ""))
    perm = None
    if g_idx is not None:
        perm = torch.argsort(g_idx.to(torch.int64), stable=True)
        if not torch.equal(g_idx[perm].to(torch.int64), torch.arange(k) // group_size):
            raise ValueError("quant.pack: g_idx must put exactly group_size rows of K in each group")
        codes = codes[:, perm]
    patterns = codes.to(torch.int64).numpy().astype(np.uint8)
    if layout == "fragment":
        if DECODE_TILING.BK % group_size and group_size % DECODE_TILING.BK:
            raise ValueError(f"quant.pack(layout='fragment'): group_size ({group_size}) must divide or be a "
                             f"multiple of {DECODE_TILING.BK}; use layout='plain'")
        patterns = DECODE_TILING.to_fragment_order(patterns).reshape(n, k)     # same bytes per row of W
    stream = np.packbits(((patterns[..., None] >> np.arange(bits)) & 1).astype(np.uint8).reshape(n, -1),
                         axis=1, bitorder="little")
    return QuantizedWeight(torch.from_numpy(stream), scales, zeros, perm, bits, group_size, format,
                           float(global_scale), layout)


def from_gptq(qweight: torch.Tensor, qzeros: Optional[torch.Tensor], scales: torch.Tensor,
              g_idx: Optional[torch.Tensor] = None, *, bits: int = 4, group_size: int = 128,
              symmetric: bool = False, layout: str = "plain") -> QuantizedWeight:
    """A GPTQ checkpoint's tensors (qweight int32 [K*bits/32, N], qzeros int32 [K/G, N*bits/32] holding
    zero - 1, scales [K/G, N], g_idx [K] or None) as a QuantizedWeight. `symmetric` ignores qzeros.
    bits is 2, 3, 4 or 8; 3-bit codes cross word boundaries (32 codes in 3 words), as AutoGPTQ packs them."""
    if not 2 <= bits <= 8 or bits in (5, 6, 7):
        raise ValueError(f"from_gptq: GPTQ checkpoints hold 2, 3, 4 or 8-bit codes, got bits={bits}")
    q = _unpack_gptq(qweight, bits, axis=0)                      # [K, N]
    zeros = None
    if not symmetric and qzeros is not None:
        zeros = (_unpack_gptq(qzeros, bits, axis=1) + 1).t().to(scales.dtype)       # [N, K/G]
    return pack(q.t(), scales.t().contiguous(), zeros, bits=bits, group_size=group_size, g_idx=g_idx, layout=layout)


def from_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, *,
             group_size: int = 128, layout: str = "plain") -> QuantizedWeight:
    """An AWQ checkpoint's 4-bit tensors (qweight int32 [K, N/8], qzeros int32 [K/G, N/8], both in AWQ's
    nibble order, scales [K/G, N]) as a QuantizedWeight."""
    q = _unpack_int32(qweight, 4, axis=1, order=AWQ_ORDER)       # [K, N]
    z = _unpack_int32(qzeros, 4, axis=1, order=AWQ_ORDER)        # [K/G, N]
    return pack(q.t(), scales.t().contiguous(), z.t().to(scales.dtype), bits=4, group_size=group_size,
                layout=layout)


def _unpack_gptq(packed: torch.Tensor, bits: int, axis: int) -> torch.Tensor:
    """int32 words along `axis` read as one little-endian bit stream of `bits`-bit codes -> int64 codes along
    `axis`. GPTQ packs this way for every width: for 2, 4 and 8 bits code j of a word sits at bits
    [j*bits, (j+1)*bits); 3-bit codes run on across words (code 10 of 32 is bits 30-31 of word 0 and bit 0 of
    word 1)."""
    words = packed.movedim(axis, -1).contiguous().numpy().astype("<i4")
    stream = np.unpackbits(words.view(np.uint8), axis=-1, bitorder="little")        # [..., 32 * words]
    if stream.shape[-1] % bits:
        raise ValueError(f"from_gptq: {words.shape[-1]} int32 words along axis {axis} do not hold a whole "
                         f"number of {bits}-bit codes")
    fields = stream.reshape(*stream.shape[:-1], -1, bits).astype(np.int64)
    codes = (fields << np.arange(bits)).sum(-1)
    return torch.from_numpy(codes).movedim(-1, axis)


def _unpack_int32(packed: torch.Tensor, bits: int, axis: int, order=None) -> torch.Tensor:
    """int32 words holding 32/bits codes each (code j at bits [j*bits, (j+1)*bits)) -> int64 codes, the codes
    of one word consecutive along `axis` (in `order` when given)."""
    per_word = 32 // bits
    words = packed.to(torch.int64) & 0xFFFFFFFF
    codes = torch.stack([(words >> (j * bits)) & ((1 << bits) - 1) for j in range(per_word)], dim=-1)
    if order is not None:
        codes = codes[..., torch.argsort(torch.tensor(order))]
    codes = codes.movedim(-1, axis + 1)
    shape = list(packed.shape)
    shape[axis] *= per_word
    return codes.reshape(shape)


def quantize(w: torch.Tensor, *, bits: int = 4, group_size: int = 128, symmetric: bool = True,
             format: str = "int", scale_dtype: torch.dtype = torch.float16,
             layout: str = "plain") -> QuantizedWeight:
    """Round-to-nearest quantization of W [N, K] (float) in groups of `group_size` along K."""
    n, k = w.shape
    if format == "mxfp4" or format == "nvfp4":
        return _quantize_fp4(w, format)
    groups = w.float().reshape(n, k // group_size, group_size)
    top = 2 ** bits - 1
    if symmetric:
        scale = groups.abs().amax(-1).clamp(min=1e-8) / (2 ** (bits - 1) - 0.5 if bits > 1 else 1)
        zero = None
        q = (groups / scale[..., None] + 2 ** (bits - 1)).round().clamp(0, top)
    else:
        low, high = groups.amin(-1), groups.amax(-1)
        scale = ((high - low) / top).clamp(min=1e-8)
        zero = (-low / scale).round().clamp(0, top)
        q = (groups / scale[..., None] + zero[..., None]).round().clamp(0, top)
    return pack(q.reshape(n, k).to(torch.int64), scale.to(scale_dtype),
                None if zero is None else zero.to(scale_dtype), bits=bits, group_size=group_size, layout=layout)


def _quantize_fp4(w: torch.Tensor, format: str) -> QuantizedWeight:
    """MXFP4 (e8m0 scales per 32) or NVFP4 (e4m3 scales per 16, global f32 scale) by round to nearest."""
    n, k = w.shape
    group = 32 if format == "mxfp4" else 16
    groups = w.float().reshape(n, k // group, group)
    amax = groups.abs().amax(-1).clamp(min=1e-12)
    global_scale = 1.0
    if format == "mxfp4":
        scale_bits = tessera.e8m0.encode((amax / 6.0).numpy())       # fp4's largest value is 6
    else:
        global_scale = float(amax.max() / (6.0 * 448.0))             # e4m3's largest value is 448
        scale_bits = tessera.f8e4m3.encode((amax / 6.0 / global_scale).numpy())
    scale_dtype = tessera.e8m0 if format == "mxfp4" else tessera.f8e4m3
    scale = torch.from_numpy(scale_dtype.decode(scale_bits).astype(np.float32)) * global_scale
    codes = tessera.f4e2m1.encode((groups / scale[..., None]).reshape(n, k).numpy())
    return pack(torch.from_numpy(codes.astype(np.int64)), torch.from_numpy(scale_bits), bits=4, group_size=group,
                format=format, global_scale=global_scale)
