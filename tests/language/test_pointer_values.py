"""Pointer values: addresses stored in memory, converted to pointers and used like pointer arguments.

The specification: `addr.to(tessera.pointer_type(dtype))` turns 64-bit
integer addresses (scalars or tiles) into pointers, `ptr.to(tessera.i64)`
gives a pointer's address; such pointers make views, move by pointer
arithmetic, and load and store, in the interpreter (which follows an
address into the array holding it, among the kernel's arrays and those
given to `tessera.addresses`, bounds-checking every access), the SIMT
simulator, and compiled code for NVIDIA and AMD. A grouped GEMM over
separate allocations (Triton's tutorial 08) is the example.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import tessera

from everywhere import run_everywhere


@tessera.kernel
def gather_groups(ptrs, sizes_ptr, out_ptr, addr_ptr, BLOCK: tessera.constexpr):
    """Program g copies group g (an array of its own, reached through its address) into row g of out."""
    g = tessera.program_id(0)
    src = tessera.load(ptrs + g).to(tessera.pointer_type(tessera.f32))
    n = tessera.load(sizes_ptr + g)
    offs = tessera.arange(0, BLOCK)
    x = tessera.load(src + offs, mask=offs < n, other=-1.0)
    row = (out_ptr + g * BLOCK).to(tessera.i64)            # and back: the address of row g, as a pointer again
    tessera.store(row.to(tessera.pointer_type(tessera.f32)) + offs, x)
    tessera.store(addr_ptr + g, (src + 1).to(tessera.i64))


def group_arrays():
    return [np.arange(5, dtype=np.float32) + 10 * i for i in range(3)]


def test_addresses_loaded_from_memory_are_pointers_into_their_arrays():
    arrays = group_arrays()
    ptrs = tessera.addresses(arrays)

    def args():
        return [ptrs, np.array([5, 3, 4], np.int32), np.zeros(3 * 8, np.float32), np.zeros(3, np.int64)]

    _, _, out, addrs = run_everywhere(gather_groups, args, (3,), BLOCK=8)
    expected = np.full((3, 8), -1.0, np.float32)
    for g, n in enumerate([5, 3, 4]):
        expected[g, :n] = arrays[g][:n]
    assert out.reshape(3, 8).tolist() == expected.tolist()
    assert addrs.tolist() == [a.ctypes.data + 4 for a in arrays]           # the address of element 1, in bytes


@tessera.kernel
def read_through(ptrs, out_ptr, index, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    src = tessera.load(ptrs + index).to(tessera.pointer_type(tessera.f32))
    tessera.store(out_ptr + offs, tessera.load(src + offs))


def test_an_access_past_the_array_an_address_points_into_is_an_error_naming_it():
    arrays = group_arrays()
    with pytest.raises(tessera.InterpreterError, match=r"the array at 0x[0-9a-f]+', which holds 5 f32 elements"):
        read_through[(1,)](tessera.addresses(arrays), np.zeros(8, np.float32), 1, BLOCK=8)


def test_an_address_inside_no_reachable_array_is_an_error_naming_it():
    stray = np.array([0x1000], np.int64)
    with pytest.raises(tessera.InterpreterError, match="address 0x1000 .inside no array the kernel can reach"):
        read_through[(1,)](stray, np.zeros(8, np.float32), 0, BLOCK=8)


@tessera.kernel
def lane_pointers(ptrs, out_ptr, BLOCK: tessera.constexpr):
    """A tile of pointers: lane i follows address i."""
    offs = tessera.arange(0, BLOCK)
    pointers = tessera.load(ptrs + offs).to(tessera.pointer_type(tessera.f32))
    tessera.store(out_ptr + offs, tessera.load(pointers))


def test_a_tile_of_pointers_into_one_array_runs_everywhere():
    data = np.arange(16, dtype=np.float32) * 3
    order = np.array([5, 0, 15, 2, 2, 9, 1, 7], np.int64)
    ptrs = np.asarray(tessera.addresses([data]))[0] + 4 * order      # a gather by pointers (data stays alive)
    _, out = run_everywhere(lane_pointers, lambda: [ptrs.copy(), np.zeros(8, np.float32)], (1,), BLOCK=8)
    assert out.tolist() == data[order].tolist()


def test_a_tile_of_pointers_into_two_arrays_is_refused_by_the_interpreter_with_the_way_out():
    ptrs = tessera.addresses(group_arrays() + group_arrays())
    with pytest.raises(tessera.InterpreterError, match="point into two different arrays.*load through each"):
        lane_pointers[(1,)](np.asarray(ptrs)[:4].copy(), np.zeros(4, np.float32), BLOCK=4)


# -- the grouped GEMM ----------------------------------------------------------------------------------------


def _tutorial_kernel(name: str):
    """A kernel of tutorial 07 (its file name starts with a digit, so not by `import`)."""
    path = Path(__file__).resolve().parents[2] / "tutorials" / "07-dropout-and-grouped-gemm.py"
    spec = importlib.util.spec_from_file_location("tutorial_06", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


# C_g = A_g @ B_g for groups of different sizes, each matrix its own allocation (Triton's tutorial 08):
# program (t, g) computes tile t of group g; tiles past the group's end leave at once.
grouped_gemm = _tutorial_kernel("grouped_gemm")


SHAPES = [(40, 32, 32), (16, 48, 16), (64, 16, 48)]       # (M, N, K) per group


def grouped_problem():
    rng = np.random.default_rng(8)
    a = [rng.standard_normal((m, k)).astype(np.float16) for m, n, k in SHAPES]
    b = [rng.standard_normal((k, n)).astype(np.float16) for m, n, k in SHAPES]
    c = [np.zeros((m, n), np.float32) for m, n, k in SHAPES]
    return a, b, c


def test_a_grouped_gemm_over_separate_allocations_runs_everywhere():
    a, b, c = grouped_problem()
    sizes = np.array(SHAPES, np.int32).reshape(-1)
    tiles = max(-(-m // 16) * -(-n // 16) for m, n, k in SHAPES)
    pointers = [tessera.addresses(x) for x in (a, b, c)]
    run_everywhere(grouped_gemm, lambda: [*pointers, sizes], (tiles, len(SHAPES)),
                   tolerance=dict(rtol=1e-5, atol=1e-5), BM=16, BN=16, BK=16)
    for ai, bi, ci in zip(a, b, c):     # the last launch (the simulator's) wrote c in place
        np.testing.assert_allclose(ci, ai.astype(np.float32) @ bi.astype(np.float32), rtol=1e-3, atol=1e-3)


def test_the_grouped_gemm_pipelines_its_k_loop_on_sm_80():
    a, b, c = grouped_problem()
    compiled = grouped_gemm.compile(*[tessera.addresses(x) for x in (a, b, c)], np.zeros(9, np.int32),
                                    BM=16, BN=16, BK=16, target="sm_80", strict=True)
    assert "cp.async" in compiled.stages["ptx"]


@tessera.kernel
def narrow_address(p):
    tessera.store(p, p.to(tessera.i32))


@tessera.kernel
def float_address(x_ptr):
    tessera.load(tessera.load(x_ptr).to(tessera.pointer_type(tessera.f32)))


@pytest.mark.parametrize("kernel, args, fragment", [
    (narrow_address, (np.zeros(1, np.int32),), "a 64-bit integer (tessera.i64 or tessera.u64), not i32"),
    (float_address, (np.zeros(1, np.float32),), "pointers come from integer addresses"),
])
def test_conversions_that_cannot_be_addresses_are_compile_errors(kernel, args, fragment):
    with pytest.raises(tessera.TypeMismatchError) as info:
        kernel.specialize(*args)
    assert fragment in info.value.message
