"""Addresses computed with small odd divisors compile for AMD in seconds.

LLVM 22's AMDGPU DAG combiner looped forever on the zero-extended index of a
one-register pointer tile (`out_ptr + offs % 3` at BLOCK=16: over 600 s on
gfx90a and gfx942, 0.2 s on sm_90a). A one-register `addptr` is now a scalar
GEP, so these are the issue's repros, bounded by the compile worker's limit:
a regression fails here instead of hanging the suite.
"""

from __future__ import annotations

import pytest

import tessera


@pytest.fixture(autouse=True)
def bounded_compiles(monkeypatch):
    monkeypatch.setenv("TESSERA_COMPILE_TIMEOUT", "30")


@tessera.kernel
def store_mod_3(out_ptr, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    tessera.store(out_ptr + offs % 3, offs)


@tessera.kernel
def store_div_3(out_ptr, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    tessera.store(out_ptr + offs // 3, offs)


@pytest.mark.parametrize("kernel", [store_mod_3, store_div_3], ids=["mod", "div"])
@pytest.mark.parametrize("target", ["gfx90a", "gfx942", "sm_90a"])
def test_an_address_with_an_odd_divisor_compiles(kernel, target):
    compiled = kernel.compile(signature="*i32:16", BLOCK=16, num_warps=1, target=target)
    assert compiled.stages["amdgcn" if target.startswith("gfx") else "ptx"]
