"""The IR's text form: print -> parse -> print is the identity, for hand-written
IR covering every op and for generated programs; parse errors say where."""

import math

import pytest
from hypothesis import HealthCheck, given, settings

from program_strategies import programs
from tessera.ir import dtypes as dt
from tessera.ir.builder import Builder
from tessera.ir.core import Location
from tessera.ir.errors import ParseError
from tessera.ir.ops import OPS
from tessera.ir.parser import parse_module
from tessera.ir.printer import print_module, print_op
from tessera.ir.types import ScalarType, TileType
from tessera.ir.verifier import verify_module

EXAMPLES = {
    "constants_and_ids": """\
func @ids() {
  %pid = program_id {axis = 0} : i32
  %np = num_programs {axis = 2} : i32
  %c = constant {value = 1024} : i32
  %one = constant {value = 1.0} : f32
  %two = constant {value = 2} : f32
  %big = constant {value = 1e+300} : f64
  %ninf = constant {value = -inf} : tile<4x8xf32>
  %nan = constant {value = nan} : bf16
  %z = constant {value = -0.0} : f16
  %t = constant {value = true} : bool
  %h = constant {value = 0.1} : f8e4m3
  %offs = arange {end = 1024, start = 0} : tile<1024xi32>
  return
}
""",
    "shapes": """\
func @shapes(%s: f32, %t: tile<1x64xf32>) {
  %a = splat %s : tile<64x64xf32>
  %b = broadcast %t : tile<64x64xf32>
  %c = expand_dims %t {axis = 0} : tile<1x1x64xf32>
  %d = reshape %a : tile<4096xf32>
  %e = permute %a {order = [1, 0]} : tile<64x64xf32>
  return
}
""",
    "layouts": """\
func @layouts(%acc: tile<16x8xf32>, %p: tile<16x8xptr<f16>>) {
  %c = convert_layout %acc {layout = "local(2,1).spatial(8,4).local(1,2)"} : tile<16x8xf32>
  %q = convert_layout %p {layout = "local(2,1).column_spatial(4,8).local(2,1)"} : tile<16x8xptr<f16>>
  return
}
""",
    "elementwise": """\
func @elementwise(%x: tile<128xf32>, %y: tile<128xf32>, %i: tile<128xi32>, %j: tile<128xu8>) {
  %0 = add %x, %y : tile<128xf32>
  %1 = sub %0, %y : tile<128xf32>
  %2 = mul %1, %x : tile<128xf32>
  %3 = div %2, %y : tile<128xf32>
  %4 = rem %3, %y : tile<128xf32>
  %5 = min %4, %x : tile<128xf32>
  %6 = max %5, %x : tile<128xf32>
  %7 = neg %6 : tile<128xf32>
  %8 = abs %7 : tile<128xf32>
  %a = and %i, %i : tile<128xi32>
  %o = or %a, %i : tile<128xi32>
  %xo = xor %o, %i : tile<128xi32>
  %l = shl %j, %j : tile<128xu8>
  %r = shr %l, %j : tile<128xu8>
  %n = not %xo : tile<128xi32>
  %m0 = exp %x : tile<128xf32>
  %m1 = exp2 %m0 : tile<128xf32>
  %m2 = log %m1 : tile<128xf32>
  %m3 = log2 %m2 : tile<128xf32>
  %m4 = sqrt %m3 : tile<128xf32>
  %m5 = rsqrt %m4 : tile<128xf32>
  %m6 = sin %m5 : tile<128xf32>
  %m7 = cos %m6 : tile<128xf32>
  %m8 = tanh %m7 : tile<128xf32>
  %m9 = erf %m8 : tile<128xf32>
  %m10 = sigmoid %m9 : tile<128xf32>
  %m11 = floor %m10 : tile<128xf32>
  %m12 = ceil %m11 : tile<128xf32>
  return
}
""",
    "compare_select_cast": """\
func @compare(%x: tile<16x16xf16>, %y: tile<16x16xf16>) {
  %lt = cmp %x, %y {pred = "lt"} : tile<16x16xbool>
  %m = select %lt, %x, %y : tile<16x16xf16>
  %w = cast %m : tile<16x16xf32>
  %b = bitcast %m : tile<16x16xi16>
  return
}
""",
    "memory": """\
func @memory(%p: ptr<f32>, %n: i32, %s: ptr<i32, shared>) {
  %offs = arange {end = 128, start = 0} : tile<128xi32>
  %ps = splat %p : tile<128xptr<f32>>
  %addrs = addptr %ps, %offs : tile<128xptr<f32>>
  %ns = splat %n : tile<128xi32>
  %mask = cmp %offs, %ns {pred = "lt"} : tile<128xbool>
  %zero = constant {value = 0.0} : tile<128xf32>
  %v = load %addrs, %mask, %zero : tile<128xf32>
  store %addrs, %v, %mask
  %old = atomic_rmw %addrs, %v, %mask {kind = "add"} : tile<128xf32>
  %prev = atomic_cas %addrs, %v, %old : tile<128xf32>
  %seen = load_acquire %addrs, %mask, %zero : tile<128xf32>
  store_release %addrs, %seen, %mask
  %x = load %s : i32
  store %s, %x
  nanosleep %n
  return
}
""",
    "views": """\
func @views(%base: ptr<bf16>, %m: i64, %k: i64, %sm: i64, %sk: i64, %i: i64, %j: i64) {
  %a = make_view %base, %m, %k, %sm, %sk : view<bf16, 2>
  %blk = view_load %a, %i, %j {fill = -inf, shape = [64, 32]} : tile<64x32xbf16>
  view_store %a, %i, %j, %blk
  return
}
""",
    "reductions": """\
func @reductions(%x: tile<32x64xf32>) {
  %s = reduce %x {axis = 1, kind = "sum"} : tile<32xf32>
  %m = reduce %s {axis = 0, kind = "max"} : f32
  %c = reduce %x {axis = 0, kind = "custom"} : tile<64xf32> {
  ^(%a: f32, %b: f32):
    %ab = mul %a, %b : f32
    yield %ab
  }
  %cs = scan %x {axis = 1, kind = "sum", reverse = true} : tile<32x64xf32>
  %cc = scan %x {axis = 0, kind = "custom"} : tile<32x64xf32> {
  ^(%a_1: f32, %b_1: f32):
    %hi = max %a_1, %b_1 : f32
    yield %hi
  }
  %am = arg_reduce %x {axis = 1, kind = "argmax"} : tile<32xi32>
  return
}
""",
    "dot": """\
func @matmul(%a: tile<64x32xf16>, %b: tile<32x128xf16>, %acc: tile<64x128xf32>) attributes {num_stages = 3, num_warps = 4} {
  %c = dot %a, %b, %acc {input_precision = "tf32"} : tile<64x128xf32>
  return
}
""",
    "for": """\
func @loop(%n: i32, %x: tile<128xf32>) {
  %lb = constant {value = 0} : i32
  %step = constant {value = 1} : i32
  %acc, %last = for %lb, %n, %step, %x, %lb : tile<128xf32>, i32 {
  ^(%i: i32, %a: tile<128xf32>, %k: i32):
    %a2 = add %a, %x : tile<128xf32>
    yield %a2, %i
  }
  for %lb, %n, %step {
  ^(%j: i32):
    yield
  }
  return
}
""",
    "if": """\
func @branch(%c: bool, %x: f32, %y: f32) {
  %r = if %c : f32 {
    %s = add %x, %y : f32
    yield %s
  } {
    yield %y
  }
  if %c {
    yield
  } {
    yield
  }
  return
}
""",
    "while": """\
func @countdown(%n: i32) {
  %zero = constant {value = 0} : i32
  %one = constant {value = 1} : i32
  %r = while %n : i32 {
  ^(%k: i32):
    %go = cmp %k, %zero {pred = "gt"} : bool
    condition %go, %k
  } {
  ^(%k_1: i32):
    %next = sub %k_1, %one : i32
    yield %next
  }
  return
}
""",
    "debug": """\
func @debug(%x: tile<8xi32>, %ok: tile<8xbool>) {
  print %x {prefix = "x = \\"quoted\\"\\n"}
  print {prefix = "é, no operands"}
  assert %ok {message = "x must be positive"}
  breakpoint %x, %ok {names = ["x", "ok"]}
  return
}
""",
    "thread_level": """\
func @thread_level(%p: ptr<f32>, %m: regs<4xbool>) {
  %tid = thread_id : i32
  %b = constant {value = 1} : i32
  %offs = pack %tid, %tid, %tid, %b : regs<4xi32>
  %ps = splat %p : regs<4xptr<f32>>
  %addr = addptr %ps, %offs : regs<4xptr<f32>>
  %v = load %addr, %m {vector = 4} : regs<4xf32>
  store %addr, %v, %m {vector = 4}
  %x = extract %v {index = 2} : f32
  %y = shuffle %x, %b {mode = "bfly", width = 16} : f32
  %smem = shared_alloc {bytes = 512, offset = -1} : ptr<f32, shared>
  store %smem, %y
  barrier
  %fa = constant {value = 0.5} : regs<8xf16>
  %fb = constant {value = 2.0} : regs<4xf16>
  %fc = constant {value = 0.0} : regs<4xf32>
  %fd = mma %fa, %fb, %fc {k = 16, m = 16, n = 8} : regs<4xf32>
  %wa = constant {value = 1.5} : regs<4xbf16>
  %wc = constant {value = 0.0} : regs<16xf32>
  %wd = mfma %wa, %wa, %wc {k = 8, m = 32, n = 32} : regs<16xf32>
  %tiles = shared_alloc {bytes = 512, offset = 0} : ptr<f16, shared>
  %frag = ldmatrix %tiles {num = 4, trans = true} : regs<8xf16>
  stmatrix %tiles, %frag {num = 4, trans = false}
  %column = lds_read_tr %tiles : regs<4xf16>
  %go = constant {value = true} : bool
  async_copy %smem, %p, %go {bytes = 16}
  async_commit
  async_wait {pending = 0}
  return
}
""",
    "low_bit": """\
func @low_bit(%w: ptr<u4>) {
  %offsets = constant {value = 3} : regs<8xi32>
  %ws = splat %w : regs<8xptr<u4>>
  %wp = addptr %ws, %offsets : regs<8xptr<u4>>
  %bytes_at = byte_address %wp : regs<8xptr<u8>>
  %bits_at = bit_offset %wp : regs<8xi32>
  %bytes = load %bytes_at : regs<8xu8>
  %x = unpack_bits %bytes {packed = "u4"} : regs<16xf16>
  %q = unpack_bits %bytes {packed = "u4"} : regs<16xu4>
  %packed = pack_bits %q : regs<8xu8>
  return
}
""",
    "bulk_async": """\
func @bulk_async(%map: tensormap) {
  %bar = shared_alloc {bytes = 8, offset = 8192} : ptr<i64, shared>
  %box = shared_alloc {bytes = 8192, offset = 0} : ptr<bf16, shared>
  %one = constant {value = 1} : i32
  %row = constant {value = 64} : i32
  %bytes = constant {value = 8192} : i32
  mbarrier_init %bar, %one
  fence_mbarrier_init
  fence_proxy_async
  fence_proxy_async_global
  mbarrier_arrive_expect_tx %bar, %bytes
  mbarrier_expect_tx %bar, %bytes
  tma_load %box, %map, %row, %one, %bar
  mbarrier_arrive %bar
  mbarrier_wait %bar, %one
  tma_store %box, %map, %row, %one
  bulk_commit_group
  bulk_wait_group_read {pending = 0}
  bulk_wait_group {pending = 0}
  mbarrier_inval %bar
  return
}
""",
    "cluster": """\
func @cluster(%map: tensormap) attributes {cluster_dims = [2, 1, 1]} {
  %bar = shared_alloc {bytes = 8, offset = 8192} : ptr<i64, shared>
  %box = shared_alloc {bytes = 8192, offset = 0} : ptr<bf16, shared>
  %rank = cluster_rank : i32
  %cy = cluster_id {axis = 1} : i32
  cluster_arrive
  cluster_wait
  tma_load %box, %map, %rank, %cy, %bar {multicast = 3}
  mbarrier_arrive_cluster %bar, %rank
  return
}
""",
    "warpgroup": """\
func @warpgroup(%p: ptr<bf16, shared>) attributes {num_threads = 128} {
  fence_proxy_async
  %a = wgmma_desc %p {lbo = 16, sbo = 1024, swizzle = 128} : i64
  %b = wgmma_desc %p {lbo = 128, sbo = 256, swizzle = 0} : i64
  %c = constant {value = 0.0} : regs<32xf32>
  wgmma_fence
  %d = wgmma %a, %b, %c {dtype = "bf16", k = 16, m = 64, n = 64} : regs<32xf32>
  %e = wgmma %a, %b, %d {dtype = "f16", k = 16, m = 64, n = 64, trans_a = false, trans_b = true} : regs<32xf32>
  wgmma_commit
  wgmma_wait {pending = 0}
  return
}
""",
    "explicit_shared_memory": """\
func @k(%a: ptr<f16>, %n: i32, %i: i32) {
  %buf = smem_alloc : smem<2x16x32xf16>
  %one = constant {value = 1} : i32
  %v = make_view %a, %n, %n, %n, %one : view<f16, 2>
  %s = smem_slot %buf, %i : smem<16x32xf16>
  smem_async_copy %s, %v, %i, %i
  smem_async_commit
  smem_async_wait {pending = 0}
  smem_barrier
  %x = smem_load %s : tile<16x32xf16>
  smem_store %s, %x
  return
}
""",
    "mbarriers": """\
func @k(%a: ptr<f16>, %n: i32, %i: i32) {
  %bars = smem_mbarriers : smem<2x1xi64>
  %buf = smem_alloc : smem<2x16x32xf16>
  %one = constant {value = 1} : i32
  %v = make_view %a, %n, %n, %n, %one : view<f16, 2>
  %s = smem_slot %buf, %i : smem<16x32xf16>
  %b = smem_slot %bars, %i : smem<1xi64>
  smem_async_copy %s, %v, %i, %i, %b
  smem_mbarrier_wait %b, %i
  return
}
""",
    "warp_specialization": """\
func @warp_specialization() attributes {num_threads = 384} {
  setmaxnreg {action = "dec", count = 40}
  %e = elect_sync : bool
  named_barrier {count = 256, id = 1}
  return
}
""",
    "wave_schedule": """\
func @wave_schedule(%x: i32) attributes {num_threads = 512} {
  %g = wave_uniform %x : i32
  phase_barrier {fenced = true}
  set_priority {level = 1}
  sched_fence
  set_priority {level = 0}
  phase_barrier
  return
}
""",
    "language_ops": """\
func @language_ops(%i: tile<128xu32>, %w: i64, %wides: tile<4xu64>) {
  %hi = umulhi %i, %i : tile<128xu32>
  %wide = umulhi %w, %w : i64
  %m = multiple_of %i {values = [16]} : tile<128xu32>
  %c = max_contiguous %m {values = [128]} : tile<128xu32>
  %k = multiple_of %w {values = [16]} : i64
  %zero = constant {value = 0} : i64
  %ok = cmp %k, %zero {pred = "ge"} : bool
  assume %ok
  %p = int_to_ptr %w : ptr<f16>
  %ps = int_to_ptr %wides : tile<4xptr<f32>>
  %a = ptr_to_int %p : i64
  %swapped = inline_asm %i {asm = "prmt.b32 $0, $1, 0, 0x0123;", constraints = "=r,r", pack = 1} : tile<128xu32>
  return
}
""",
    "two_functions": """\
func @first() {
  return
}

func @second() attributes {flag = true, name = "k", shape = [], weights = [1, -2]} {
  return
}
""",
}


@pytest.mark.parametrize("name", EXAMPLES)
def test_handwritten_ir_round_trips_and_verifies(name):
    module = parse_module(EXAMPLES[name])
    assert print_module(module) == EXAMPLES[name]
    verify_module(module)


def test_examples_cover_every_op():
    used = {op.name for text in EXAMPLES.values() for fn in parse_module(text).functions for op in fn.walk()}
    assert set(OPS) - used == set()


def test_attribute_kinds_survive_a_round_trip():
    ops = parse_module(EXAMPLES["constants_and_ids"]).functions[0].body.ops
    values = {op.results[0].name_hint: op.attrs["value"] for op in ops if op.name == "constant"}
    assert type(values["one"]) is float and type(values["two"]) is int and type(values["t"]) is bool
    assert math.copysign(1.0, values["z"]) == -1.0 and math.isnan(values["nan"])


def test_locations_print_and_parse():
    text = """\
func @k(%x: f32, %c: bool) loc("kernel.py":3:0) {
  %y = add %x, %x : f32 loc("kernel.py":4:8)
  %r = if %c : f32 {
    yield %y loc("a \\"b\\".py":5:1)
  } {
    yield %x
  } loc("kernel.py":5:4)
  return
}
"""
    module = parse_module(text)
    verify_module(module)
    assert print_module(module, locations=True) == text
    fn = module.functions[0]
    assert fn.loc == Location("kernel.py", 3, 0)
    assert fn.body.ops[0].loc == Location("kernel.py", 4, 8)
    assert "loc(" not in print_module(module)


def test_printer_makes_names_unique_and_numbers_the_unnamed():
    b = Builder()
    f32 = ScalarType(dt.f32)
    fn = b.function("k", [f32, f32], ["x", "x"])
    x0, x1 = fn.args
    s = b.create("add", [x0, x1], result_names=["x_1"]).result
    t = b.create("mul", [s, s]).result
    u = b.create("sub", [t, t], result_names=["a.b"]).result
    b.create("max", [u, u], result_names=["9lives"])
    b.create("return")
    assert print_module(b.module) == """\
func @k(%x: f32, %x_1: f32) {
  %x_1_1 = add %x, %x_1 : f32
  %0 = mul %x_1_1, %x_1_1 : f32
  %a_b = sub %0, %0 : f32
  %_9lives = max %a_b, %a_b : f32
  return
}
"""
    assert print_op(fn.body.ops[1]) == "%0 = mul %x_1_1, %x_1_1 : f32"


def test_print_op_elides_regions():
    fn = parse_module(EXAMPLES["for"]).functions[0]
    assert print_op(fn.body.ops[2]) == "%acc, %last = for %lb, %n, %step, %x, %lb : tile<128xf32>, i32 {...}"


def test_parser_reads_every_type_spelling():
    text = "func @t(%a: f32, %b: ptr<f16>, %c: ptr<f16, shared>, %d: tile<64x32xbf16>, " \
           "%e: tile<128xptr<f32>>, %f: view<f32, 2>, %g: tile<2xptr<i8, shared>>, %h: f4e2m1) {\n  return\n}\n"
    fn = parse_module(text).functions[0]
    assert [str(a.type) for a in fn.args] == [
        "f32", "ptr<f16>", "ptr<f16, shared>", "tile<64x32xbf16>", "tile<128xptr<f32>>",
        "view<f32, 2>", "tile<2xptr<i8, shared>>", "f4e2m1"]
    assert fn.args[3].type == TileType(ScalarType(dt.bf16), (64, 32))


def test_comments_and_blank_lines_are_ignored():
    text = "// a kernel\n\nfunc @k() {  // entry\n\n  return // done\n}\n"
    assert print_module(parse_module(text)) == "func @k() {\n  return\n}\n"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_generated_programs_round_trip_and_verify(module):
    verify_module(module)
    for locations in (False, True):
        text = print_module(module, locations=locations)
        parsed = parse_module(text)
        assert print_module(parsed, locations=locations) == text
        verify_module(parsed)


# ---------------------------------------------------------------------------
# Parse errors


@pytest.mark.parametrize("text, message", [
    ("func @f(%x: f32) {\n  %y = add %x %x : f32\n}\n", "line 2:15: expected"),
    ("func @f(%x: f32) {\n  %y = add %x, %z : f32\n}\n", "line 2:16: use of undefined value %z in function @f"),
    ("func @f(%x: f32) {\n  %x = neg %x : f32\n}\n", "line 2:3: value %x is defined twice"),
    ("func @f(%x: f32) {\n  %y = frobnicate %x : f32\n}\n", "line 2:8: unknown op 'frobnicate'"),
    ("func @f(%x: f33) {\n  return\n}\n", "line 1:13: unknown dtype 'f33'"),
    ("func @f(%x: ptr<f32, texture>) {\n  return\n}\n", "unknown address space 'texture'"),
    ("func @f(%x: f32) {\n  %a, %b = neg %x : f32\n}\n", "line 2:12: neg defines 2 results but lists 1 result types"),
    ("func @f(%x: f32) {\n  return\n", "expected '}'"),
    ("func @f() {\n  print {prefix = \"a\", prefix = \"b\"}\n}\n", "attribute 'prefix' given twice"),
])
def test_parse_errors_say_where_and_what(text, message):
    with pytest.raises(ParseError, match="line") as err:
        parse_module(text)
    assert message in str(err.value)


def test_parser_accepts_ill_typed_ir_for_the_verifier_to_reject():
    module = parse_module("func @f(%x: f32, %i: i32) {\n  %y = add %x, %i : f16\n  return\n}\n")
    assert module.functions[0].body.ops[0].results[0].type == ScalarType(dt.f16)
