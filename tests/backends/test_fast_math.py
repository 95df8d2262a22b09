"""`@tessera.kernel(fast_math=True)`: f32 math on the hardware approximations, division by a reciprocal and
fused multiply-adds in GPU code; the default stays exact; the interpreter computes exactly either way.

Specification:

* the kernel's tile IR carries `fast_math = true` (so every stage, and the binary cache key, sees it);
* NVPTX: exp2/exp on `ex2.approx.ftz.f32` and log2/log on `lg2.approx.ftz.f32` (even where libdevice is
  found), f32 division `div.approx.f32`, a * b + c one `fma.rn.f32`; the exact kernel keeps `div.rn.f32`
  and rounds x * y and the sum separately (`mul.rn` / `add.rn`);
* AMDGPU: division by `v_rcp_f32` with none of the exact division's `v_div_scale` / `v_div_fixup` steps;
* -inf and NaN keep their meaning (no `ninf` / `nnan` flags: attention masks with -inf).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tessera.backends.nvptx import find_ptxas

from fast_math_programs import exact, fast

SIGNATURE = "*f32:16,*f32:16,*f32:16"


def instructions(text: str, pattern: str) -> set[str]:
    return set(re.findall(pattern, text))


def test_the_option_is_recorded_on_the_tile_ir():
    assert "fast_math = true" in fast.ir(np.zeros(8, np.float32), np.ones(8, np.float32), np.zeros(8, np.float32),
                                         BLOCK=8)
    assert "fast_math" not in exact.ir(np.zeros(8, np.float32), np.ones(8, np.float32), np.zeros(8, np.float32),
                                       BLOCK=8)


@pytest.mark.parametrize("libdevice", [False, None], ids=["approximations", "libdevice-if-found"])
def test_nvptx_fast_math_uses_the_approximations_and_fuses(libdevice, monkeypatch):
    if libdevice is False:
        monkeypatch.setenv("TESSERA_LIBDEVICE", "/nonexistent")
    ptx = fast.compile(signature=SIGNATURE, target="sm_80", BLOCK=128).stages["ptx"]
    found = instructions(ptx, r"\b(ex2\.\S+|lg2\.\S+|div\.\S+|fma\.\S+|mul\.\S+f32|add\.\S+f32)")
    assert {"ex2.approx.ftz.f32", "lg2.approx.ftz.f32", "div.approx.f32", "fma.rn.f32"} <= found
    assert "div.rn.f32" not in found and "__nv_" not in ptx


def test_nvptx_exact_kernel_rounds_every_step():
    ptx = exact.compile(signature=SIGNATURE, target="sm_80", BLOCK=128).stages["ptx"]
    found = instructions(ptx, r"\b(div\.\S+|fma\.\S+|mul\.\S+f32|add\.\S+f32)")
    assert {"div.rn.f32", "mul.rn.f32", "add.rn.f32"} <= found


def test_amdgpu_fast_division_is_a_reciprocal():
    fast_asm = fast.compile(signature=SIGNATURE, target="gfx942", BLOCK=128).stages["amdgcn"]
    exact_asm = exact.compile(signature=SIGNATURE, target="gfx942", BLOCK=128).stages["amdgcn"]
    assert "v_rcp_f32" in fast_asm and "v_div_scale_f32" not in fast_asm and "v_div_fixup_f32" not in fast_asm
    assert "v_div_scale_f32" in exact_asm


def test_infinities_keep_their_meaning_in_llvm_ir():
    llvm = fast.compile(signature=SIGNATURE, target="sm_80", BLOCK=128).stages["llvm_ir"]
    assert "afn" in llvm and "contract" in llvm and "ninf" not in llvm and "nnan" not in llvm and " fast " not in llvm


def test_the_interpreter_computes_exactly_either_way():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(64).astype(np.float32), rng.uniform(0.5, 2, 64).astype(np.float32)
    out_fast, out_exact = np.zeros_like(x), np.zeros_like(x)
    fast[(1,)](x, y, out_fast, BLOCK=64)
    exact[(1,)](x, y, out_exact, BLOCK=64)
    np.testing.assert_array_equal(out_fast, out_exact)


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
def test_fast_math_ptx_assembles():
    assert fast.compile(signature=SIGNATURE, target="sm_90a", BLOCK=128).cubin
