"""`tessera.inline_asm_elementwise`: target assembly lane by lane, checked before LLVM sees it.

The specification: PTX on NVIDIA targets and AMDGCN on AMD ones reach the
binary verbatim (`pack` lanes per instance, packed into one register);
the interpreter and the SIMT simulator run the author's numpy emulation;
every mistake -- constraints, operand numbers, register widths, asm for the
other vendor, an instruction the assembler rejects, no emulation on the
CPU -- is an error at the asm's source line, and the process survives.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import tessera
from tessera.backends.amdgpu.assembler import find_assembler
from tessera.backends.nvptx.ptxas import find_ptxas

from everywhere import run_everywhere


@tessera.asm_emulation
def swap_bytes(x, *selector):
    return x.byteswap()


@tessera.asm_emulation
def add_bytes(a, b):
    return (a.astype(np.int64) + b.astype(np.int64)).astype(np.int8)


@tessera.kernel
def asm_kernel(x_ptr, swapped_ptr, sums_ptr, VENDOR: tessera.constexpr, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    x = tessera.load(x_ptr + offs)
    small = x.to(tessera.i8)
    if VENDOR == "nvidia":
        swapped = tessera.inline_asm_elementwise("prmt.b32 $0, $1, 0, 0x0123;", "=r,r", [x], dtype=tessera.i32,
                                                 is_pure=True, pack=1, emulate=swap_bytes)
        sums = tessera.inline_asm_elementwise("{\n .reg .b32 lo, hi;\n add.s32 $0, $1, $2;\n}", "=r,r,r",
                                              [small, small], dtype=tessera.i8, is_pure=True, pack=4,
                                              emulate=add_bytes)
    else:
        swapped = tessera.inline_asm_elementwise("v_perm_b32 $0, $1, $1, $2", "=v,v,v", [x, 0x00010203],
                                                 dtype=tessera.i32, is_pure=True, pack=1, emulate=swap_bytes)
        sums = small + small
    tessera.store(swapped_ptr + offs, swapped)
    tessera.store(sums_ptr + offs, sums)


def args():
    x = (np.arange(128, dtype=np.int64) * 0x01020304 % 2**31).astype(np.int32)
    return [x, np.zeros(128, np.int32), np.zeros(128, np.int8)]


@pytest.mark.parametrize("vendor, targets", [("nvidia", ("sm_80", "sm_90a")), ("amd", ("gfx942",))])
def test_inline_asm_reaches_the_binary_and_its_emulation_runs_on_the_cpu(vendor, targets):
    x, swapped, sums = run_everywhere(asm_kernel, args, (1,), targets=targets, VENDOR=vendor, BLOCK=128)
    assert swapped.tolist() == x.byteswap().tolist()
    assert sums.tolist() == (2 * x.astype(np.int8)).astype(np.int8).tolist()
    compiled = asm_kernel.compile(*args(), VENDOR=vendor, BLOCK=128, target=targets[0])
    text = compiled.stages["ptx"] if vendor == "nvidia" else compiled.stages["amdgcn"]
    assert ("prmt.b32" in text and "0x0123;" in text) if vendor == "nvidia" else "v_perm_b32" in text


@tessera.kernel
def one_asm(x_ptr, ASM: tessera.constexpr, CONSTRAINTS: tessera.constexpr, DTYPE: tessera.constexpr,
            PACK: tessera.constexpr):
    offs = tessera.arange(0, 64)
    y = tessera.inline_asm_elementwise(ASM, CONSTRAINTS, [tessera.load(x_ptr + offs)], dtype=DTYPE, is_pure=True,
                                       pack=PACK)
    tessera.store(x_ptr + offs, y.to(tessera.i32))


def asm_line() -> int:
    lines, first = inspect.getsourcelines(one_asm.fn)
    return first + next(i for i, line in enumerate(lines) if "inline_asm_elementwise(" in line)


@pytest.mark.parametrize("asm, constraints, fragment", [
    ("mov.b32 $0, $1;", "r,r", "must start with exactly one output"),
    ("mov.b32 $0, $1;", "=r,r,r", "has 1 args but 2 input constraints"),
    ("mov.b32 $0, $2;", "=r,r", "names $2, but there are only $0 (the result) to $1"),
    ("mov.b32 $0, $1;", "=r,rr", "each must be one register letter"),
])
def test_malformed_asm_is_a_compile_error_while_tracing(asm, constraints, fragment):
    with pytest.raises(tessera.CompileError) as info:
        one_asm.specialize(np.zeros(64, np.int32), ASM=asm, CONSTRAINTS=constraints, DTYPE=tessera.i32, PACK=1)
    assert info.value.line == asm_line() and fragment in info.value.message


@pytest.mark.parametrize("target, asm, constraints, dtype, pack, fragment", [
    ("sm_80", "mov.b64 $0, $1;", "=r,r", tessera.i64, 1, "holds a 32-bit register, but 1 i64 lane(s)"),
    ("sm_80", "v_mov_b32 $0, $1", "=v,v", tessera.i32, 1, "constraint 'v' is not a register class of the NVPTX"),
    ("gfx942", "mov.b32 $0, $1;", "=r,r", tessera.i32, 1, "constraint 'r' is not a register class of the AMDGPU"),
    ("sm_80", "mov.b32 $0, $1;", "=r,r", tessera.i32, 2, "2 i32 lane(s) per instance make 64 bits"),
])
def test_asm_that_does_not_fit_the_target_is_refused_before_llvm(target, asm, constraints, dtype, pack, fragment):
    with pytest.raises(tessera.CompileError) as info:
        one_asm.compile(np.zeros(64, np.int32), ASM=asm, CONSTRAINTS=constraints, DTYPE=dtype, PACK=pack,
                        target=target)
    assert info.value.line == asm_line() and fragment in info.value.message


@pytest.mark.parametrize("target, asm, constraints, said", [
    ("sm_80", "frobnicate.b32 $0, $1;", "=r,r", "frobnicate"),              # ptxas rejects it
    ("gfx942", "v_frobnicate_b32 $0, $1", "=v,v", "invalid instruction"),   # clang's assembler, not LLVM's abort
])
def test_asm_the_assembler_rejects_is_a_compile_error_at_the_asm_and_the_process_lives_on(target, asm, constraints,
                                                                                        said):
    if (find_assembler() if target.startswith("gfx") else find_ptxas()) is None:
        pytest.skip(f"no assembler for {target} installed")
    with pytest.raises(tessera.CompileError) as info:
        one_asm.compile(np.zeros(64, np.int32), ASM=asm, CONSTRAINTS=constraints, DTYPE=tessera.i32, PACK=1,
                        target=target)
    assert info.value.line == asm_line() and "inline assembly" in info.value.message and said in info.value.message


def test_without_an_emulation_the_interpreter_says_how_to_give_one():
    with pytest.raises(tessera.InterpreterError, match="inline assembly runs only on GPUs; .* emulate="):
        one_asm[(1,)](np.zeros(64, np.int32), ASM="mov.b32 $0, $1;", CONSTRAINTS="=r,r", DTYPE=tessera.i32, PACK=1)
