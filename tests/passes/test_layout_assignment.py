"""Layout assignment: the blocked default, the propagation rules, conversions and pinned layouts."""

from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np
import pytest

import tessera
from tessera.backends.interp import run_function
from tessera.backends.simt import run_threads
from tessera.ir.layouts import local, parse_layout, replicated, spatial
from tessera.ir.parser import parse_module
from tessera.ir.target import get_target
from tessera.ir.types import TileType
from tessera.passes.errors import LoweringError
from tessera.passes.layout_assignment import assign_layouts, blocked_layout, insert_unit_dim
from tessera.passes.lower_to_threads import lower_to_threads
from tessera.passes.shared_memory import allocate_shared_memory

TUTORIALS = Path(__file__).resolve().parents[2] / "tutorials"
SM80 = get_target("sm_80")


def _tutorial(file: str, name: str):
    return runpy.run_path(str(TUTORIALS / file))[name]


ADD = _tutorial("01-vector-add.py", "add")
SOFTMAX = _tutorial("02-fused-softmax.py", "softmax")
MATMUL = _tutorial("03-matmul.py", "matmul")


def tile_values(fn):
    values = []
    for op in fn.walk():
        values += [r for r in op.results if isinstance(r.type, TileType)]
        for region in op.regions:
            values += [a for a in region.args if isinstance(a.type, TileType)]
    return values


def named(fn, assignment):
    return {v.name_hint: assignment.layout(v) for v in tile_values(fn) if v.name_hint}


# ---------------------------------------------------------------------------
# The blocked default


@pytest.mark.parametrize("shape, vector, warps, warp_size, expected", [
    ((1024,), 4, 4, 32, "local(2).spatial(128).local(4)"),     # lanes, then warps, then repeats
    ((64,), 4, 1, 32, "spatial(32).local(2)"),                  # small tile: fewer per thread, all threads busy
    ((16, 64), 4, 4, 32, "local(2,1).spatial(8,16).local(1,4)"),
    ((64, 64), 8, 4, 32, "local(4,1).spatial(16,8).local(1,8)"),
    ((2, 256), 4, 4, 32, "spatial(2,64).local(1,4)"),           # warps go to dim 1 once dim 0 is used up
    ((4, 4), 4, 4, 32, "replicated(8).spatial(4,4)"),           # 16 elements over 128 threads
    ((16,), 4, 4, 64, "replicated(16).spatial(16)"),
])
def test_blocked_layout(shape, vector, warps, warp_size, expected):
    layout = blocked_layout(shape, vector, warps, warp_size)
    assert str(layout) == expected
    assert layout.shape == shape and layout.num_threads == warps * warp_size
    assert layout == parse_layout(expected)


def test_blocked_layout_is_the_documented_product():
    layout = blocked_layout((16, 64), 4, 4, 32)
    assert layout == local(2, 1) * replicated(1) * spatial(4, 1) * replicated(1) * spatial(2, 16) * local(1, 4)
    assert layout.local_contiguity(-1) == 4


# ---------------------------------------------------------------------------
# Propagation on real kernels


def test_vector_add_is_one_layout_with_vectors_of_four():
    x = np.zeros(4096, np.float32)
    fn = ADD.specialize(x, x, x, 4096, BLOCK=1024).module.functions[0]
    a = assign_layouts(fn, SM80, 4)
    layouts = set(a.layouts.values())
    assert layouts == {parse_layout("local(2).spatial(128).local(4)")}
    assert not a.conversions


def test_softmax_reduce_and_broadcast_derive_from_the_load():
    x = np.zeros((4, 512), np.float32)
    fn = SOFTMAX.specialize(x, x, 4, 512, BLOCK=512).module.functions[0]
    a = assign_layouts(fn, SM80, 4)
    names = named(fn, a)
    values = names["values"]
    assert values == blocked_layout((1, 512), 4, 4, 32)
    ops = {op.name: op for op in fn.walk()}
    assert a.layout(ops["reduce"].result) == values.reduce(1, keepdims=False)
    assert a.layout(ops["broadcast"].operands[0]) == values.reduce(1)        # the replicated column
    assert names["shifted"] == names["numerator"] == names["result"] == values
    assert not a.conversions


def test_every_tile_gets_a_layout_of_its_shape_and_the_block():
    x16 = np.zeros((40, 40), np.float16)
    kernels = [
        (ADD, [np.zeros(100, np.float32)] * 3 + [100], {"BLOCK": 64}),
        (SOFTMAX, [np.zeros((3, 50), np.float32)] * 2 + [3, 50], {"BLOCK": 64}),
        (MATMUL, [x16, x16, x16, 40, 40, 40], {"BM": 32, "BN": 16, "BK": 16}),
    ]
    for kernel, args, constexprs in kernels:
        fn = kernel.specialize(*args, **constexprs).module.functions[0]
        for warps in (1, 2, 4, 8):
            a = assign_layouts(fn, SM80, warps)
            for v in tile_values(fn):
                layout = a.layout(v)
                assert layout.shape == v.type.shape and layout.num_threads == warps * 32


def test_matmul_accumulator_is_carried_in_one_layout():
    x = np.zeros((64, 64), np.float16)
    fn = MATMUL.specialize(x, x, x, 64, 64, 64, BM=32, BN=32, BK=16).module.functions[0]
    a = assign_layouts(fn, SM80, 4)
    loop = next(op for op in fn.walk() if op.name == "for")
    dot = next(op for op in fn.walk() if op.name == "dot")
    carried = a.layout(loop.regions[0].args[1])
    assert a.layout(loop.results[0]) == carried == a.layout(dot.result) == a.layout(loop.operands[3])
    # On sm_80 the f16 dot runs on tensor cores: the accumulator stays in the mma C layout; only the
    # operands move into their fragment layouts, and the f16 result into the store's layout after the loop.
    assert {(op.name, i) for op, i in a.conversions} == {("dot", 0), ("dot", 1), ("cast", 0)}
    # On gfx90a it runs on MFMA 32x32x8, with the same shape of plan.
    mfma = assign_layouts(fn, get_target("gfx90a"), 4)
    assert {(op.name, i) for op, i in mfma.conversions} == {("dot", 0), ("dot", 1), ("cast", 0)}
    # An f32 dot keeps the FMA lowering, whose operands and accumulator need no particular layout.
    y = np.zeros((64, 64), np.float32)
    fma_fn = MATMUL.specialize(y, y, y, 64, 64, 64, BM=32, BN=32, BK=16).module.functions[0]
    assert not assign_layouts(fma_fn, get_target("gfx90a"), 4).conversions


REDUCE_IR = """\
func @k(%x: ptr<f32>) {
  %r = arange {end = 64, start = 0} : tile<64xi32>
  %xs = splat %x : tile<64xptr<f32>>
  %p = addptr %xs, %r : tile<64xptr<f32>>
  %v = load %p : tile<64xf32>
  %s = reduce %v {axis = 0, kind = "sum"} : f32
  %t = expand_dims %v {axis = 0} : tile<1x64xf32>
  %u = permute %t {order = [1, 0]} : tile<64x1xf32>
  %w = reshape %u : tile<64xf32>
  return
}
"""


def test_shape_ops_derive_their_layouts():
    fn = parse_module(REDUCE_IR).functions[0]
    a = assign_layouts(fn, SM80, 2)
    names = named(fn, a)
    v = names["v"]
    assert names["t"] == insert_unit_dim(v, 0) and names["t"].shape == (1, 64)
    assert names["u"] == names["t"].permute([1, 0])
    assert names["w"] == v                       # only size-1 dims came and went
    assert "%v: " in a.describe()


@tessera.kernel
def scale_groups(x_ptr, s_ptr, out_ptr, G: tessera.constexpr):
    x = tessera.view(x_ptr, (16, 128)).block((16, 128), (0, 0)).load()
    s = tessera.view(s_ptr, (16, 128 // G)).block((16, 128 // G), (0, 0)).load()
    groups = tessera.reshape(x, (16, 128 // G, G)) * tessera.expand_dims(s, 2)
    tessera.view(out_ptr, (16, 128)).block((16, 128), (0, 0)).store(tessera.reshape(groups, (16, 128)))


def test_reshapes_that_split_and_merge_dims_regroup_modes_and_move_no_data():
    """A block scale's groups along K: x's layout split into groups, and merged back, is a renaming."""
    x, s = np.arange(16 * 128, dtype=np.float32).reshape(16, 128), np.arange(64, dtype=np.float32)
    module = scale_groups.specialize(x, s.reshape(16, 4), np.zeros_like(x), G=32).module
    fn = module.functions[0]
    a = assign_layouts(fn, SM80, 4)
    (split, merge) = [op for op in fn.walk() if op.name == "reshape"]
    assert a.layout(split.result) == a.layout(split.operands[0]).reshape((16, 4, 32))
    assert a.layout(merge.result) == a.layout(split.operands[0])
    thread_fn = lower_to_threads(fn, a, SM80, 4).functions[0]
    buffers = [op for op in thread_fn.walk() if op.name == "shared_alloc"]
    assert len(buffers) == 1 and buffers[0].attrs["bytes"] == 16 * 4 * 4     # the scales' own layout change
    allocate_shared_memory(thread_fn)
    out = np.zeros_like(x)
    run_threads(thread_fn, [x, s.reshape(16, 4), out], (1,))
    np.testing.assert_array_equal(out, x * np.repeat(s.reshape(16, 4), 32, axis=1))


# ---------------------------------------------------------------------------
# Conflicts, conversions and pinned layouts


@tessera.kernel
def two_loads(x_ptr, y_ptr, out_ptr, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    x = tessera.load(x_ptr + offs)
    y = tessera.load(y_ptr + offs * 2)               # strided: no contiguity, one element per thread
    tessera.store(out_ptr + offs, x + y)


def test_disagreeing_anchors_record_a_conversion_that_lowering_honours():
    x = np.arange(512, dtype=np.float32)
    fn = two_loads.specialize(x, x, x, BLOCK=256).module.functions[0]
    a = assign_layouts(fn, SM80, 2)
    names = named(fn, a)
    assert names["x"].local_contiguity(-1) == 4 and names["y"].local_contiguity(-1) == 1
    add = next(op for op in fn.walk() if op.name == "add" and isinstance(op.result.type, TileType)
               and op.result.type.element.dtype.is_float)
    assert (add, 1) in a.conversions and a.conversions[(add, 1)] == names["x"]
    _run_both(fn, a, [np.arange(512, dtype=np.float32), np.arange(512, dtype=np.float32) * 3,
                      np.zeros(512, np.float32)])


def _run_both(fn, assignment, args, grid=(1,)):
    simt = pytest.importorskip("tessera.backends.simt")
    expected = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    run_function(fn, expected, grid)
    lowered = lower_to_threads(fn, assignment, SM80).functions[0]
    allocate_shared_memory(lowered)
    actual = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    simt.run_threads(lowered, actual, grid)
    for want, got in zip(expected, actual):
        if isinstance(want, np.ndarray):
            assert want.tobytes() == got.tobytes()


def test_pinned_layout_wins_and_conflicts_convert():
    x = np.zeros(256, np.float32)
    fn = ADD.specialize(x, x, x, 256, BLOCK=256).module.functions[0]
    x_value = next(v for v in tile_values(fn) if v.name_hint == "x")
    pinned = local(4).spatial(64)              # strided: thread t holds t, t+64, t+128, t+192
    a = assign_layouts(fn, SM80, 2, overrides={x_value: pinned})
    assert a.layout(x_value) == pinned
    assert a.overrides == {x_value: pinned}
    assert a.conversions                                               # y and the store disagree with x
    rng = np.random.default_rng(0)
    _run_both(fn, a, [rng.standard_normal(256).astype(np.float32), rng.standard_normal(256).astype(np.float32),
                      np.zeros(256, np.float32), 256])


def test_loop_carried_conflict_converts_the_initial_value():
    @tessera.kernel
    def carried(x_ptr, out_ptr, steps, BLOCK: tessera.constexpr):
        offs = tessera.arange(0, BLOCK)
        acc = tessera.load(x_ptr + offs)
        for i in range(steps):
            acc = acc * 2.0 + 1.0
        tessera.store(out_ptr + offs, acc)

    x = np.arange(128, dtype=np.float32)
    fn = carried.specialize(x, x, 3, BLOCK=128).module.functions[0]
    loop = next(op for op in fn.walk() if op.name == "for")
    arg = loop.regions[0].args[1]
    pinned = local(2).spatial(64)
    a = assign_layouts(fn, SM80, 2, overrides={arg: pinned})
    assert a.layout(arg) == a.layout(loop.results[0]) == pinned
    assert a.conversions.get((loop, 3)) == pinned                      # the loaded initial value converts
    _run_both(fn, a, [x.copy(), np.zeros(128, np.float32), 3])


@tessera.kernel
def store_carried(x_ptr, c_ptr, steps, DOT: tessera.constexpr, EPILOGUE: tessera.constexpr = False):
    """A value carried around a loop and stored as it leaves it (or scaled and cast first, EPILOGUE);
    the body makes it with a dot, or not."""
    c = tessera.view(c_ptr, (64, 64))
    acc = tessera.zeros((64, 64), dtype=tessera.f32)
    for i in range(steps):
        if DOT:
            x = tessera.view(x_ptr, (64, 64)).block((64, 64), (0, 0)).load()
            acc = tessera.dot(x, x, acc)
        else:
            acc = acc + 1.0
    if EPILOGUE:
        c.block((64, 64), (0, 0)).store((acc * 2.0).to(tessera.f16))
    else:
        c.block((64, 64), (0, 0)).store(acc)


def _store_carried(dot, epilogue=False):
    c = np.zeros((64, 64), np.float16 if epilogue else np.float32)
    fn = store_carried.specialize(np.zeros((64, 64), np.float16), c, 2, DOT=dot,
                                  EPILOGUE=epilogue).module.functions[0]
    a = assign_layouts(fn, SM80, 4)
    loop = next(op for op in fn.walk() if op.name == "for")
    store = next(op for op in fn.walk() if op.name == "view_store")
    return fn, a, loop, store


def test_a_loop_carried_value_takes_its_in_loop_producers_layout_not_the_stores():
    fn, a, loop, store = _store_carried(dot=True)
    dot = next(op for op in fn.walk() if op.name == "dot")
    carried = a.layout(loop.regions[0].args[1])
    assert carried == a.layout(dot.result) == a.layout(loop.results[0])      # the mma C layout throughout
    # inside the loop only the dot's operands convert; the store converts the result once, after the loop
    assert {(op.name, i) for op, i in a.conversions} == {("dot", 0), ("dot", 1), ("view_store", 3)}
    assert a.conversions[(store, 3)] != carried
    assert a.conversions[(store, 3)] == blocked_layout((64, 64), 4, 4, 32)   # 128-bit rows of f32


def test_an_epilogue_after_the_loop_runs_in_the_dots_layout_up_to_the_op_the_store_anchors():
    fn, a, loop, store = _store_carried(dot=True, epilogue=True)
    mul = next(op for op in fn.walk() if op.name == "mul" and isinstance(op.result.type, TileType))
    assert a.layout(mul.result) == a.layout(loop.results[0]) == a.layout(loop.regions[0].args[1])
    assert {(op.name, i) for op, i in a.conversions} == {("dot", 0), ("dot", 1), ("cast", 0)}


def test_a_loop_body_that_leaves_the_layout_open_takes_the_stores():
    fn, a, loop, store = _store_carried(dot=False)
    assert a.layout(loop.regions[0].args[1]) == a.layout(loop.results[0]) == blocked_layout((64, 64), 4, 4, 32)
    assert not a.conversions


def test_bad_pins_and_configurations_are_lowering_errors():
    x = np.zeros(64, np.float32)
    fn = ADD.specialize(x, x, x, 64, BLOCK=64).module.functions[0]
    x_value = next(v for v in tile_values(fn) if v.name_hint == "x")
    with pytest.raises(LoweringError, match="covers shape"):
        assign_layouts(fn, SM80, 1, overrides={x_value: spatial(32).local(4)})         # 128 elements
    with pytest.raises(LoweringError, match="64 threads"):
        assign_layouts(fn, SM80, 2, overrides={x_value: spatial(32).local(2)})         # 32 threads
    n_value = fn.args[3]
    with pytest.raises(LoweringError, match="not a tile"):
        assign_layouts(fn, SM80, 1, overrides={n_value: spatial(32)})
    with pytest.raises(LoweringError, match="power of two"):
        assign_layouts(fn, SM80, 3)
    with pytest.raises(LoweringError, match="threads per block"):
        assign_layouts(fn, SM80, 64)
