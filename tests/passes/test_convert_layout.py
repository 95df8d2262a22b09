"""Pinning register layouts: `convert_layout` from the language through the IR to thread code.

The specification, end to end:

* IR: `convert_layout %x {layout = "..."}` prints, parses and verifies; its
  layout must parse and cover the operand's shape;
* tile interpreter and tile passes: the identity, kept (identical pins merge);
* language: `tessera.convert_layout(x, layout)` and `layout=` on zeros, full,
  load and a view block's load, with a `tessera.layouts` value (global or
  constexpr) or its text; a layout of the wrong shape is a CompileError while
  tracing;
* lowering: the pinned value lives in exactly that layout (a pinned load
  loads straight into it), the SIMT simulator agrees with the tile
  interpreter, and a pin for the wrong number of threads is a CompileError
  at the pin's source line.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera.backends.interp import run_function
from tessera.ir.errors import VerifyError
from tessera.ir.parser import parse_module
from tessera.ir.printer import print_module
from tessera.ir.target import get_target
from tessera.ir.verifier import verify_module
from tessera.passes.layout_assignment import assign_layouts, pinned_layouts
from tessera.passes.manager import PassManager
from tessera.passes.tile_passes import default_tile_passes
from tessera.passes.thread_passes import lower

simt = pytest.importorskip("tessera.backends.simt")

SM80 = get_target("sm_80")
MMA_C = tessera.layouts.local(2, 1).spatial(8, 4).local(1, 2)     # mma.sync m16n8 accumulator, 32 threads
MMA_C_TEXT = "local(2,1).spatial(8,4).local(1,2)"


def _ops(module_or_fn, name):
    fn = module_or_fn.functions[0] if hasattr(module_or_fn, "functions") else module_or_fn
    return [op for op in fn.walk() if op.name == name]


def _lines(text: str, name: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if f" {name} " in f" {line.strip()} "]


def _simulate_and_compare(module, args, num_warps, grid=(1,)):
    """Interpret the tile IR, lower and simulate the thread IR on copies of `args`; outputs must match."""
    expected = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    run_function(module.functions[0], expected, grid)
    lowered = lower(module, "sm_80", num_warps)
    actual = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    simt.run_threads(lowered.functions[0], actual, grid)
    for want, got in zip(expected, actual):
        if isinstance(want, np.ndarray):
            assert want.tobytes() == got.tobytes(), f"mismatch:\n{got}\nexpected\n{want}"
    return lowered


# ---------------------------------------------------------------------------
# The IR op

PINS = f"""\
func @pins(%x: tile<16x8xf32>, %base: ptr<f32>, %offs: tile<16x8xi32>) {{
  %a = convert_layout %x {{layout = "{MMA_C_TEXT}"}} : tile<16x8xf32>
  %b = splat %base : tile<16x8xptr<f32>>
  %p = addptr %b, %offs : tile<16x8xptr<f32>>
  %q = convert_layout %p {{layout = "local(2,1).column_spatial(4,8).local(2,1)"}} : tile<16x8xptr<f32>>
  %v = load %q : tile<16x8xf32>
  %s = add %a, %v : tile<16x8xf32>
  store %q, %s
  return
}}
"""


def test_ir_text_round_trips_and_verifies():
    module = parse_module(PINS)
    assert print_module(module) == PINS
    verify_module(module)
    (a, q) = _ops(module, "convert_layout")
    assert a.result.type == a.operands[0].type and a.attrs == {"layout": MMA_C_TEXT}
    assert pinned_layouts(module.functions[0]) == {a.result: MMA_C, q.result: tessera.layouts.parse_layout(
        "local(2,1).column_spatial(4,8).local(2,1)")}


@pytest.mark.parametrize("operand, layout, message", [
    ("tile<16x16xf32>", MMA_C_TEXT, "covers shape (16, 8), but the operand is tile<16x16xf32>"),
    ("tile<16x8xf32>", "local(2,1).spatil(8,4)", "unknown layout factor spatil"),
    ("f32", MMA_C_TEXT, "convert_layout needs a tile, got f32"),
])
def test_verifier_rejects_pins_that_do_not_fit(operand, layout, message):
    text = f'func @k(%x: {operand}) {{\n  %a = convert_layout %x {{layout = "{layout}"}} : {operand}\n  return\n}}\n'
    with pytest.raises(VerifyError, match=message.replace("(", r"\(").replace(")", r"\)")):
        verify_module(parse_module(text))


def test_tile_interpreter_treats_a_pin_as_the_identity():
    fn = parse_module(PINS).functions[0]
    x = np.arange(128, dtype=np.float32).reshape(16, 8)
    memory = np.arange(128, dtype=np.float32) * 10
    run_function(fn, [x, memory, np.arange(128, dtype=np.int32).reshape(16, 8)], grid=(1,))
    assert np.array_equal(memory, np.arange(128, dtype=np.float32) * 11)


# ---------------------------------------------------------------------------
# The language

LAYOUT_TEXT = MMA_C_TEXT


@tessera.kernel
def pinned_copy(x_ptr, out_ptr, PIN: tessera.constexpr):
    offs = tessera.arange(0, 16)[:, None] * 8 + tessera.arange(0, 8)[None, :]
    x = tessera.load(x_ptr + offs, layout=PIN)
    tessera.store(out_ptr + offs, x)


@tessera.kernel
def every_form(x_ptr, out_ptr):
    offs = tessera.arange(0, 16)[:, None] * 8 + tessera.arange(0, 8)[None, :]
    a = tessera.load(x_ptr + offs, layout=MMA_C)                    # a global layout value
    b = tessera.convert_layout(a * 2.0, LAYOUT_TEXT)                # its text, from a global
    c = tessera.zeros((16, 8), layout=tessera.layouts.mma_m16n8k16_c())       # built while tracing
    d = tessera.full((16, 8), 3.0, layout=tessera.layouts.local(2, 1).spatial(8, 4).local(1, 2))
    v = tessera.view(x_ptr, (16, 8)).block((16, 8), (0, 0)).load(fill=1.0, layout=MMA_C)
    tessera.store(out_ptr + offs, a + b + c + d + v)


def test_every_way_of_pinning_emits_the_same_canonical_pin():
    x = np.arange(128, dtype=np.float32)
    module = every_form.specialize(x, x.copy()).module
    pins = _ops(module, "convert_layout")
    assert len(pins) == 5 and {op.attrs["layout"] for op in pins} == {MMA_C_TEXT}
    sources = [op.operands[0].owner.name for op in pins]
    assert sources == ["load", "mul", "constant", "constant", "view_load"]
    out = np.zeros(128, np.float32)
    every_form[(1,)](x, out)                                        # the interpreter: pins change nothing
    assert np.array_equal(out, x + 2 * x + 0 + 3 + x)


def test_layouts_are_constexpr_arguments_and_key_the_specialization():
    x = np.arange(128, dtype=np.float32)
    a = pinned_copy.specialize(x, x, PIN=MMA_C).module
    b = pinned_copy.specialize(x, x, PIN=MMA_C_TEXT).module
    c = pinned_copy.specialize(x, x, PIN=tessera.layouts.local(16, 8)).module
    assert print_module(a) == print_module(b)
    assert _ops(c, "convert_layout")[0].attrs["layout"] == "local(16,8)"
    assert pinned_copy.specialize(x, x, PIN=MMA_C) is pinned_copy.specialize(x, x, PIN=MMA_C)


def test_wrong_shape_pin_is_a_compile_error_while_tracing():
    @tessera.kernel
    def wrong_shape(x_ptr):
        acc = tessera.zeros((16, 16), layout=MMA_C)                  # wrong shape
        tessera.store(x_ptr + tessera.arange(0, 16), tessera.sum(acc, axis=1))

    line = wrong_shape.fn.__code__.co_firstlineno + 2
    with pytest.raises(tessera.CompileError) as err:
        wrong_shape.specialize(np.zeros(16, np.float32))
    assert err.value.line == line and err.value.kernel == "wrong_shape"
    assert "covers shape (16, 8), but the tile is tile<16x16xf32>" in err.value.message


@pytest.mark.parametrize("layout, message", [
    ("'local(2,1).spatil(8,4)'", "unknown layout factor spatil"),
    ("3", "must be a register layout"),
    ("tessera.layouts.spatial(x_ptr)", "must be compile-time values"),
    ("tessera.layouts.spatial(32).local(0)", "layout sizes must be positive ints"),
])
def test_bad_layout_values_are_compile_errors(layout, message):
    kernel = _kernel_from_source(f"""
def bad(x_ptr):
    x = tessera.load(x_ptr + tessera.arange(0, 16), layout={layout})
""")
    with pytest.raises(tessera.CompileError, match=message):
        kernel.specialize(np.zeros(16, np.float32))


def _kernel_from_source(source: str):
    import linecache
    import textwrap
    filename = f"<convert_layout_test_{abs(hash(source))}>"
    source = textwrap.dedent(source)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"tessera": tessera}
    exec(compile(source, filename, "exec"), namespace)
    return tessera.kernel(namespace["bad"])


# ---------------------------------------------------------------------------
# The tile passes keep pins


def test_tile_passes_keep_pins_and_merge_identical_ones():
    @tessera.kernel
    def twice(x_ptr, out_ptr):
        offs = tessera.arange(0, 16)[:, None] * 8 + tessera.arange(0, 8)[None, :]
        x = tessera.load(x_ptr + offs)
        a = tessera.convert_layout(x, MMA_C)
        b = tessera.convert_layout(x, MMA_C)                        # the same pin again: CSE merges it
        tessera.store(out_ptr + offs, a + b)

    x = np.zeros(128, np.float32)
    module = twice.specialize(x, x).module
    assert len(_ops(module, "convert_layout")) == 2
    optimized = PassManager(default_tile_passes()).run(module)
    (pin,) = _ops(optimized, "convert_layout")
    assert pin.attrs["layout"] == MMA_C_TEXT


# ---------------------------------------------------------------------------
# Lowering


def test_a_pinned_load_loads_straight_into_the_mma_layout():
    x = np.arange(128, dtype=np.float32)
    module = pinned_copy.specialize(x, x, PIN=MMA_C).module
    fn = module.functions[0]
    assignment = assign_layouts(fn, SM80, 1, pinned_layouts(fn))
    (pin,) = _ops(fn, "convert_layout")
    assert assignment.layout(pin.result) == MMA_C
    assert assignment.layout(pin.operands[0]) == MMA_C            # the load itself: nothing to convert
    lowered = _simulate_and_compare(module, [x, np.zeros(128, np.float32)], num_warps=1)
    text = print_module(lowered)
    (load,) = _lines(text, "load")
    (store,) = _lines(text, "store")
    assert load.startswith("%x = load") and load.endswith("{vector = 2} : regs<4xf32>")  # 2 per row, 2 rows
    assert "{vector = 2}" in store
    assert not _lines(text, "shared_alloc") and "shared_bytes = 0" in text


def test_pins_next_to_default_layouts_convert_through_shared_memory():
    @tessera.kernel
    def mixed(x_ptr, out_ptr, PIN: tessera.constexpr):
        rows = tessera.arange(0, 16)[:, None]
        cols = tessera.arange(0, 8)[None, :]
        x = tessera.load(x_ptr + rows * 8 + cols)
        y = tessera.convert_layout(x * 2.0, PIN)
        p = tessera.convert_layout(x_ptr + rows * 8 + cols, PIN)   # pointers are rebuilt, not moved
        acc = tessera.zeros((16, 8), layout=PIN)
        tessera.store(out_ptr + rows * 8 + cols, y + acc + tessera.load(p) + 1.0)

    x = np.arange(128, dtype=np.float32)
    for pin, warps, registers in ((MMA_C, 1, 4), (MMA_C.replicated(4), 4, 4)):
        module = mixed.specialize(x, x, PIN=pin).module
        lowered = _simulate_and_compare(module, [x, np.zeros(128, np.float32)], num_warps=warps)
        text = print_module(lowered)
        assert _lines(text, "barrier") and _lines(text, "shared_alloc")
        assert any(line.startswith("%y = ") and line.endswith(f": regs<{registers}xf32>") for line in
                   text.splitlines() for line in [line.strip()])
    default = print_module(lower(mixed.specialize(x, x, PIN=MMA_C.replicated(4)).module, "sm_80", 4))
    assert "regs<4xf32>" in default                                 # the pinned replicated layout: 4 per thread
    assert _lines(default, "load")[0].endswith("regs<1xf32>")      # the default spreads 128 over 128 threads


def test_an_impossible_pin_is_a_compile_error_at_its_line():
    sixty_four_threads = tessera.layouts.local(2, 1).spatial(8, 8)

    @tessera.kernel
    def impossible(x_ptr, out_ptr):
        offs = tessera.arange(0, 16)[:, None] * 8 + tessera.arange(0, 8)[None, :]
        x = tessera.load(x_ptr + offs, layout=sixty_four_threads)
        tessera.store(out_ptr + offs, x)

    pin_line = impossible.fn.__code__.co_firstlineno + 3
    with pytest.raises(tessera.CompileError) as err:
        impossible.compile(signature="*f32:16,*f32:16", target="sm_80", num_warps=4)
    e = err.value
    assert e.kernel == "impossible" and e.line == pin_line and e.file == __file__
    assert "64 threads" in e.message and "128 threads" in e.message and "num_warps=2" in e.message
    assert "layout=sixty_four_threads" in str(e)                    # the source line, with a caret under it


def test_a_pinned_kernel_compiles_to_ptx():
    compiled = pinned_copy.compile(signature="*f32:16,*f32:16", target="sm_80", num_warps=1, PIN=MMA_C)
    assert "regs<4xf32>" in compiled.stages["thread_ir"]
    assert "ld.global" in compiled.stages["ptx"]


def test_a_layout_pin_keeps_alignment_facts():
    from tessera.ir.parser import parse_module
    from tessera.passes.alignment import analyze

    fn = parse_module("""\
func @k() {
  %offs = arange {end = 128, start = 0} : tile<128xi32>
  %pinned = convert_layout %offs {layout = "local(1).spatial(128)"} : tile<128xi32>
  return
}
""").functions[0]
    facts = analyze(fn)
    offs, pinned = fn.body.ops[0].result, fn.body.ops[1].result
    assert facts[pinned] == facts[offs] and facts[pinned].contiguity == (128,)
