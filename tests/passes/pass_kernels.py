"""Real kernels for the pass tests, and the check every pass must pass on them.

    before, after = run_before_and_after(CASES["softmax"], [Canonicalize()])

traces a kernel with the frontend, runs the tile interpreter on a copy of
its IR, runs the passes (verifying the IR after each) on another copy, runs
the interpreter again on the same inputs made afresh, and asserts that every output array
is bit-for-bit the same. It returns the op counts before and after.

The cases are the three tutorials and kernels written to give the passes
something to do: constant arithmetic, constexpr branches and loops that run
zero times or once, runtime `if`s, `while` and `for` loops, `where`, casts,
integer division, reductions with a custom combine, and masked loads.
"""

from __future__ import annotations

import runpy
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

import tessera
from tessera.backends.interp import run_function
from tessera.ir.core import Module
from tessera.passes.manager import PassManager
from tessera.passes.rewrite import clone_function

TUTORIALS = Path(__file__).parents[2] / "tutorials"


def _tutorial(file: str, name: str):
    return runpy.run_path(str(TUTORIALS / file))[name]


@tessera.kernel
def constant_heavy(x_ptr, out_ptr, n, BLOCK: tessera.constexpr, SCALE: tessera.constexpr):
    offs = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    mask = offs < n
    x = tessera.load(x_ptr + offs, mask=mask, other=0.0)
    k = (SCALE * 4 + 2) // 3 - 1                     # constant arithmetic after specialization
    y = x * 1.0 + k
    y = tessera.where(k > 0, y, x)                   # a constant condition
    z = tessera.full((BLOCK,), 2.5, tessera.f32) * tessera.full((BLOCK,), 4, tessera.f32)
    w = (y + z - z) * (k - k + 1)
    for i in range(0):                               # never runs
        w = w + 100.0
    for i in range(1):                               # runs once
        w = w + i + 0.5
    tessera.store(out_ptr + offs, w.to(tessera.f16).to(tessera.f32), mask=mask)


@tessera.kernel
def integer_ops(x_ptr, out_ptr, n, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    mask = offs < n
    x = tessera.load(x_ptr + offs, mask=mask, other=0)
    a = x * 1 + 0 - 0
    b = (a // 1) * 7 % 5
    c = (a & -1) | 0
    d = (c ^ c) + (a * 0) + (b << 0) + (b >> 0)
    e = (7 // 2) * (-7 // 2) + (-7 % 3) + (2147483647 + x * 0 + 1)
    q = x // (offs - offs)                            # division by a zero tile: not folded
    tessera.store(out_ptr + offs, a + b + c + d + e + q * 0, mask=mask)


@tessera.kernel
def control_flow(x_ptr, out_ptr, n, steps, BLOCK: tessera.constexpr, MODE: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    mask = offs < n
    x = tessera.load(x_ptr + offs, mask=mask, other=0.0)
    acc = tessera.zeros((BLOCK,), tessera.f32)
    for i in range(steps):                             # runtime trip count
        t = x * (i + 1)
        acc = acc + t
        if n > 3:                                      # a runtime branch in a loop
            acc = acc + tessera.sum(t, axis=0)
        else:
            acc = acc - 1.0
    if MODE == 1:
        acc = acc * 2.0
    j = 0
    while j < 3:
        acc = acc + x * 1.0
        j += 1
    m = tessera.max(acc, axis=0)
    tessera.store(out_ptr + offs, acc + m * 0.0, mask=mask)


@tessera.func
def _largest(a, b):
    return tessera.maximum(a, b)


@tessera.kernel
def reductions(x_ptr, out_ptr, BLOCK: tessera.constexpr):
    rows = tessera.arange(0, BLOCK)
    x = tessera.load(x_ptr + rows)
    big = tessera.reduce(x * 1.0, 0, _largest)
    total = tessera.sum(x, axis=0) + tessera.sum(x, axis=0)
    scanned = tessera.cumsum(x + 0.0, axis=0)
    tessera.store(out_ptr + rows, scanned + big + total)


@dataclass
class Case:
    """A kernel, how to make its inputs, its constexprs and its grid."""

    kernel: object
    make_args: Callable[[np.random.Generator], list]
    constexprs: dict
    grid: tuple[int, ...]


def _floats(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


CASES = {
    "vector_add": Case(_tutorial("01-vector-add.py", "add"),
                       lambda r: [_floats(r, 100), _floats(r, 100), np.zeros(100, np.float32), 100],
                       {"BLOCK": 32}, (4,)),
    "softmax": Case(_tutorial("02-fused-softmax.py", "softmax"),
                    lambda r: [_floats(r, 8, 13), np.zeros((8, 13), np.float32), 8, 13], {"BLOCK": 16}, (8,)),
    "matmul": Case(_tutorial("03-matmul.py", "matmul"),
                   lambda r: [_floats(r, 20, 40, dtype=np.float16), _floats(r, 40, 24, dtype=np.float16),
                              np.zeros((20, 24), np.float16), 20, 24, 40],
                   {"BM": 16, "BN": 16, "BK": 16}, (2, 2)),
    "constant_heavy": Case(constant_heavy, lambda r: [_floats(r, 50), np.zeros(50, np.float32), 50],
                           {"BLOCK": 16, "SCALE": 3}, (4,)),
    "integer_ops": Case(integer_ops, lambda r: [r.integers(-99, 99, 16).astype(np.int32),
                                                np.zeros(16, np.int32), 13], {"BLOCK": 16}, (1,)),
    "control_flow": Case(control_flow, lambda r: [_floats(r, 16), np.zeros(16, np.float32), 11, 3],
                         {"BLOCK": 16, "MODE": 1}, (1,)),
    "control_flow_small_n": Case(control_flow, lambda r: [_floats(r, 16), np.zeros(16, np.float32), 2, 2],
                                 {"BLOCK": 16, "MODE": 0}, (1,)),
    "reductions": Case(reductions, lambda r: [_floats(r, 32), np.zeros(32, np.float32)], {"BLOCK": 32}, (1,)),
}


def traced(case: Case, seed: int = 0) -> Module:
    """A fresh copy of the case's tile IR (the kernel's own cached module stays untouched)."""
    args = case.make_args(np.random.default_rng(seed))
    module = case.kernel.specialize(*args, **case.constexprs).module
    return Module([clone_function(fn) for fn in module.functions])


def op_count(module) -> int:
    return sum(1 for fn in module.functions for _ in fn.walk())


def run(module, case: Case, seed: int) -> list[np.ndarray]:
    """The case's arguments after running the module's kernel on them."""
    args = case.make_args(np.random.default_rng(seed))
    run_function(module.functions[0], args, case.grid)
    return [a for a in args if isinstance(a, np.ndarray)]


def run_before_and_after(case: Case, passes: list, seed: int = 0) -> tuple[int, int]:
    """Assert the passes keep every output bit; return the op counts before and after."""
    before = traced(case, seed)
    expected = run(before, case, seed)
    after = PassManager(passes).run(Module([clone_function(fn) for fn in before.functions]))  # verifies each pass
    actual = run(after, case, seed)
    for want, got in zip(expected, actual, strict=True):
        assert want.tobytes() == got.tobytes()
    return op_count(before), op_count(after)


# ---------------------------------------------------------------------------
# Random kernels: the frontend tests' generator of DSL programs with for / if /
# while loops and early exits (tests/dsl/kernel_generator.py).

sys.path.insert(0, str(Path(__file__).parents[1] / "dsl"))
from kernel_generator import BLOCK, NUMPY, Program, load_kernel, programs  # noqa: E402,F401


def generated_case(program: Program, n: int, seed: int) -> Case:
    """The generated program as a Case over BLOCK lanes with `n` of them live."""
    kernel = load_kernel(program.source("generated"), "generated")

    def make_args(rng):
        if program.dtype == "i32":
            x, y = (rng.integers(-9, 10, BLOCK).astype(np.int32) for _ in range(2))
        else:
            x, y = (rng.uniform(-2, 2, BLOCK).astype(np.float32) for _ in range(2))
        return [x, y, np.full(BLOCK, NUMPY[program.dtype](77)), n]

    return Case(kernel, make_args, {"BLOCK": BLOCK}, (1,))
