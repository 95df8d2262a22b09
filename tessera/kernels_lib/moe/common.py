"""What the MoE kernels' host code shares: where a launch runs, and tensors as kernel arguments."""

from __future__ import annotations

import functools
from typing import Optional

import torch

import tessera

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_TESSERA_DTYPES = {torch.bfloat16: tessera.bf16, torch.float8_e4m3fn: tessera.f8e4m3}


def kernel_arg(t: torch.Tensor, dtype: Optional[tessera.DType] = None):
    """`t` as a kernel argument: a CPU tensor as a numpy array for the tile interpreter (bfloat16 and fp8 as
    their bits, reinterpreted, since numpy has neither); a CUDA tensor as it is (the launcher takes it, and
    runs it on the interpreter under TESSERA_INTERPRET=1). `dtype` views the bytes as another type (uint8
    as packed u4 codes)."""
    if t.device.type != "cpu":
        return t if dtype is None else tessera.reinterpret(t, dtype)
    dtype = dtype or _TESSERA_DTYPES.get(t.dtype)
    if dtype is None:
        return t.numpy()
    bits = torch.uint16 if dtype.bits == 16 else torch.uint8
    return tessera.reinterpret(t.view(bits).numpy(), dtype)


@functools.lru_cache(maxsize=None)
def num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def check_device(name: str, reference: torch.Tensor, **tensors: Optional[torch.Tensor]) -> None:
    """Every given tensor is on `reference`'s device, or a ValueError names the one that is not."""
    for what, t in tensors.items():
        if t is not None and t.device != reference.device:
            raise ValueError(f"tessera::{name}: {what} is on {t.device} but the input is on {reference.device}; "
                             f"move it with .to({str(reference.device)!r})")
