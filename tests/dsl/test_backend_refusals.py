"""What a backend cannot compile is a CompileError at the user's line, never a backend exception.

`kernel.compile(...)` (and every GPU launch, which compiles through the same
driver) reports a backend's refusal -- a dtype, an op or a math function the
target lacks -- as a `CompileError` naming the kernel, pointing at the source
line of the op that needs it, and saying what to change there. A kernel
argument the backend cannot take is reported at its first use. LLVM or a
tool failing is a compiler bug, reported as one.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import tessera
from tessera.backends.llvm.errors import BackendError
from tessera.dsl import compiler

TARGETS = ["sm_80", "sm_90a", "gfx942"]


def line_of(kernel, text: str) -> int:
    lines, first = inspect.getsourcelines(kernel.fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def refusal(kernel, *args, target: str, **constexprs) -> tessera.CompileError:
    with pytest.raises(tessera.CompileError) as info:
        kernel.compile(*args, target=target, **constexprs)
    assert type(info.value) is tessera.CompileError
    assert info.value.kernel == kernel.name
    return info.value


@tessera.kernel
def add_nibble(x_ptr, out_ptr, b, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    x = tessera.load(x_ptr + offs)
    tessera.store(out_ptr + offs, x + b.to(tessera.u8))


@pytest.mark.parametrize("target", TARGETS)
def test_a_scalar_argument_the_backend_cannot_take_is_refused_where_it_is_used(target):
    # (pointers to sub-byte elements compile on every target: tests/backends/test_low_bit_targets.py)
    error = refusal(add_nibble, signature="*u8,*u8,u4", target=target, BLOCK=128)
    assert error.line == line_of(add_nibble, "b.to(")
    assert f"cannot compile for {target}" in error.message
    assert "parameter 'b' of sub-byte type u4" in error.message
    assert "pass it as an 8-bit integer" in error.message       # the fix


@tessera.kernel
def exp_f64(x_ptr, out_ptr, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    x = tessera.load(x_ptr + offs)
    y = tessera.exp(x)
    tessera.store(out_ptr + offs, y)


def test_a_math_function_the_target_lacks_is_refused_at_its_line_with_the_fix():
    x = np.zeros(64, np.float64)
    error = refusal(exp_f64, x, x, BLOCK=64, target="gfx942")
    assert error.line == line_of(exp_f64, "tessera.exp(")
    assert "cannot compile `exp` for gfx942" in error.message
    assert "cast to f32 first" in error.message
    assert "%" not in error.message          # no thread IR in what the user reads


def test_llvm_failing_is_an_internal_compile_error_naming_the_kernel(monkeypatch):
    def crash(*args):
        raise BackendError("LLVM ERROR: Cannot select: intrinsic %llvm.nvvm.bogus")

    monkeypatch.setattr(compiler, "_nvptx", crash)
    x = np.zeros(64, np.float32)
    error = refusal(exp_f64, x, x, BLOCK=64, target="sm_80")
    assert "internal compiler error" in error.message and "Cannot select" in error.message
    assert error.line == line_of(exp_f64, "def exp_f64")
