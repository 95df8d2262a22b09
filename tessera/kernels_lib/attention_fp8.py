"""fp8 attention forward as a PyTorch op: `tessera::attention_fp8`, reached through `attention(q, k, v, ...,
q_descale=, k_descale=, v_descale=)` when q, k, v are float8_e4m3fn.

FlashAttention-3's convention: the real tensors are codes * descale, one
float32 descale per tensor (a Python float or a 1-element tensor, which
stays on the device: no synchronization). The forward kernel
(`attention_fwd.py`, FP8) multiplies the codes on fp8 tensor cores
(mma.sync m16n8k32 on sm_89, wgmma k32 on sm_90a) for both Q K^T and
P V, with P quantized to e4m3; O comes back in `out_dtype` (bfloat16 by
default), LSE in float32 as for `attention`. fp8 tensor cores read both
operands contiguous along the reduced dim, which for P V is the keys, so the
op hands the kernel V transposed, contiguous along the keys and zero-padded
to a multiple of 16 (`keys_contiguous`: one copy of V, S * D bytes per head,
where FA3 transposes V in shared memory, which Tessera cannot express for
8-bit tiles yet); on sm_90a K and V then both stream by TMA. P reaches the
P V wgmma through shared memory, not registers: Tessera's register-A wgmma
is f16/bf16 only (fp8's k32 fragment is not the accumulator's; FA3 permutes
bytes between lanes). On gfx950 both products run on its OCP fp8 MFMA
(v_mfma_f32_32x32x16_fp8_fp8), K and V streamed into LDS rings by
direct-to-LDS loads, P through LDS. sm_80 has no fp8 tensor cores and
gfx942's fp8 MFMA reads the fnuz formats, not float8_e4m3fn: both are
refused with the fix (dequantize and call the bf16 op). Forward only, like
FA3's; batched only (no varlen).
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from .attention import GPU_PLANS, Plan, Problem, _check, _forward, _on_interpreter
from .targets import device_arch, fp8_matrix_cores

# Per target and head dim, like attention.GPU_PLANS; sm_89 (mma.sync m16n8k32, K = BN for P V) takes BN = 32 at
# head dim 128 (BN = 64 spilled 8 bytes at 255 registers). gfx950 takes its bf16 plans (attention.GPU_PLANS):
# fp8 halves their rings' LDS bytes, and every variant compiles without spills or scratch (at most 416 of the
# 512 VGPRs and AGPRs a lane may hold: head dim 256; bench/results/amd_registers_gfx950_fp8.json). No config spills
# (tests/kernels_lib/test_attention_fp8_compile.py); none has been timed on a GPU.
FP8_GPU_PLANS = {
    "sm_89": {64: Plan(128, 64, 8), 128: Plan(128, 32, 8), 256: Plan(64, 32, 4)},
    "sm_90a": {64: Plan(128, 64, 8), 128: Plan(128, 64, 8), 256: Plan(64, 32, 4)},
    "gfx950": GPU_PLANS["gfx950"],
}

FP8_DTYPES = (torch.float8_e4m3fn,)
OUT_DTYPES = (torch.bfloat16, torch.float16)
Descale = Union[None, float, torch.Tensor]
OP = "tessera::attention_fp8"
DEQUANTIZE = ("dequantize to bfloat16 (x.to(torch.bfloat16) * x_descale for each of q, k, v) and call "
              "tessera.kernels_lib.attention without descales")


def require_fp8_tensor_cores(arch: str) -> None:
    """A ValueError naming the fix unless `arch` multiplies e4m3 on tensor cores that Tessera's dot lowers to."""
    if fp8_matrix_cores(arch):
        return
    if arch.startswith("gfx"):
        raise ValueError(f"{OP}: {arch}: Tessera's dot has no MFMA for float8_e4m3fn there (gfx942's fp8 MFMA reads "
                         f"the fnuz formats; gfx950 is the AMD GPU it runs on), so the fp8 kernel would run on FMA; "
                         f"{DEQUANTIZE}")
    raise ValueError(f"{OP}: {arch} has no fp8 tensor cores (they begin with sm_89: L40, H100); {DEQUANTIZE}")


def descales(q: torch.Tensor, q_descale: Descale, k_descale: Descale, v_descale: Descale) -> torch.Tensor:
    """The three descales as one float32 tensor on q's device (None means 1.0)."""
    parts = []
    for name, d in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if d is None or isinstance(d, (int, float)):
            parts.append(torch.tensor(1.0 if d is None else float(d), dtype=torch.float32, device=q.device))
            continue
        if not isinstance(d, torch.Tensor) or d.numel() != 1 or not d.is_floating_point():
            raise ValueError(f"{OP}: {name} must be a float or a 1-element floating tensor (one descale per "
                             f"tensor), got {d if not isinstance(d, torch.Tensor) else tuple(d.shape)}")
        if d.device != q.device:
            raise ValueError(f"{OP}: {name} is on {d.device} but q on {q.device}; move it with .to(q.device)")
        parts.append(d.reshape(()).to(torch.float32))
    return torch.stack(parts)


def fp8_plan(D: int, arch: str) -> Plan:
    """The plan for head dim D on `arch` (Hopper: sm_90a's; gfx950: its own; other GPUs with fp8 tensor cores:
    sm_89's)."""
    plans = FP8_GPU_PLANS[arch if arch in ("sm_90a", "gfx950") else "sm_89"]
    if D not in plans:
        raise ValueError(f"{OP}: head dim {D} has no GPU plan; use one of {sorted(plans)}")
    return plans[D]


def keys_contiguous(v: torch.Tensor) -> torch.Tensor:
    """v (B, S, H, D) copied into a zero-filled (B, H, D, S16) buffer, S16 = S rounded up to 16, and returned as
    its (B, S16, H, D) view: keys contiguous (stride 1), 16-byte rows; the kernel's V blocks read up to S16."""
    B, S, H, D = v.shape
    if v.stride(1) == 1 and S % 16 == 0 and all(s % 16 == 0 for s in (v.stride(0), v.stride(2), v.stride(3))):
        return v
    buffer = torch.zeros((B, H, D, -(-S // 16) * 16), dtype=v.dtype, device=v.device)
    buffer[..., :S] = v.permute(0, 2, 3, 1)
    return buffer.permute(0, 3, 1, 2)


def _check_fp8(q, k, v, descale: torch.Tensor, out_dtype: torch.dtype) -> None:
    _check(q, k, v, 4, "attention_fp8", FP8_DTYPES)
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"{OP}: out_dtype {out_dtype} is not supported; use torch.bfloat16 or torch.float16")
    if descale.shape != (3,) or descale.dtype != torch.float32:
        raise ValueError(f"{OP}: descales must be float32 (q, k, v), got {descale.dtype} {tuple(descale.shape)}")


def _attention_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, descale: torch.Tensor, causal: bool = False,
                   window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                   scale: Optional[float] = None,
                   out_dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """The implementation of `torch.ops.tessera.attention_fp8`: `descale` holds the q, k, v descales."""
    _check_fp8(q, k, v, descale, out_dtype)
    plan = None
    if not _on_interpreter(q):
        arch = device_arch(q.device)
        require_fp8_tensor_cores(arch)
        plan = fp8_plan(q.shape[-1], arch)
    problem = Problem.of(q, k, None, None, q.shape[1], k.shape[1], causal, window_left, window_right, softcap, scale)
    return _forward(q, k, keys_contiguous(v), problem, descales=descale, out_dtype=out_dtype, plan=plan)


attention_fp8_op = torch.library.custom_op(OP, _attention_fp8, mutates_args=())


@attention_fp8_op.register_fake
def _attention_fp8_fake(q, k, v, descale, causal=False, window_left=-1, window_right=-1, softcap=0.0, scale=None,
                        out_dtype=torch.bfloat16):
    _check_fp8(q, k, v, descale, out_dtype)
    B, Sq, H, _ = q.shape
    return q.new_empty(q.shape, dtype=out_dtype), q.new_empty((B, H, Sq), dtype=torch.float32)


def attention_fp8(q, k, v, left: int, right: int, softcap: float, scale: Optional[float], q_descale: Descale,
                  k_descale: Descale, v_descale: Descale, out_dtype: Optional[torch.dtype]):
    """`attention`'s fp8 path (masks already as (left, right)): the op on the stacked descales."""
    import tessera.torch
    d = descales(q, q_descale, k_descale, v_descale)
    op = _attention_fp8 if tessera.torch.unobserved(q, k, v, d) else attention_fp8_op
    return op(q, k, v, d, False, left, right, float(softcap), scale, out_dtype or torch.bfloat16)
