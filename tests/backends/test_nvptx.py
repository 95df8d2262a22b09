"""The NVPTX backend: hand-written thread IR -> PTX (and cubin where ptxas is installed).

Each test compiles for sm_80 and sm_90a and checks the PTX for the
instructions the IR asks for; with ptxas present the PTX is also assembled
and must not spill.
"""

import re

import pytest

from tessera.backends.nvptx import BackendError, CodegenError, compile_thread_ir, find_libdevice, find_ptxas
from tessera.ir.parser import parse_module

TARGETS = ("sm_80", "sm_90a")
ATTRS = "attributes {num_threads = 128, shared_bytes = 0, warp_size = 32}"
HAS_PTXAS = find_ptxas() is not None
HAS_LIBDEVICE = find_libdevice() is not None
needs_ptxas = pytest.mark.skipif(not HAS_PTXAS, reason="ptxas not found (PATH, CUDA_HOME, nvidia-cuda-nvcc wheel)")
needs_libdevice = pytest.mark.skipif(not HAS_LIBDEVICE, reason="libdevice.10.bc not found")


def compile_ir(text: str, target: str, **options):
    artifacts = compile_thread_ir(parse_module(text).functions[0], target, **options)
    if artifacts.cubin is not None:
        assert artifacts.cubin[:4] == b"\x7fELF"
        assert artifacts.ptxas_info["spill_stores"] == artifacts.ptxas_info["spill_loads"] == 0
    return artifacts


VECTOR_ADD = """\
func @vadd(%x: ptr<{t}>, %y: ptr<{t}>, %out: ptr<{t}>, %n: i32) {attrs} {{
  %tid = thread_id : i32
  %pid = program_id {{axis = 0}} : i32
  %width = constant {{value = {k}}} : i32
  %block = constant {{value = {block}}} : i32
  %base = mul %pid, %block : i32
  %first = mul %tid, %width : i32
  %start = add %base, %first : i32
  %starts = splat %start : regs<{k}xi32>
  %lanes = constant {{value = 0}} : regs<{k}xi32>
  %offs = add %starts, %lanes : regs<{k}xi32>
  %ns = splat %n : regs<{k}xi32>
  %mask = cmp %offs, %ns {{pred = "lt"}} : regs<{k}xbool>
  %xs = splat %x : regs<{k}xptr<{t}>>
  %xp = addptr %xs, %offs : regs<{k}xptr<{t}>>
  %ys = splat %y : regs<{k}xptr<{t}>>
  %yp = addptr %ys, %offs : regs<{k}xptr<{t}>>
  %os = splat %out : regs<{k}xptr<{t}>>
  %op = addptr %os, %offs : regs<{k}xptr<{t}>>
  %a = load %xp, %mask {{vector = {k}}} : regs<{k}x{t}>
  %b = load %yp, %mask {{vector = {k}}} : regs<{k}x{t}>
  %c = add %a, %b : regs<{k}x{t}>
  store %op, %c, %mask {{vector = {k}}}
  return
}}
"""


# The three pointers of vector add are disjoint: the launch says so with `noalias`.
VECTOR_ADD_ATTRS = "attributes {noalias = [0, 1, 2], num_threads = 128, shared_bytes = 0, warp_size = 32}"


def vector_add(t: str, k: int, attrs: str = VECTOR_ADD_ATTRS) -> str:
    # With `vector = k` only the first pointer of each group matters, so the
    # lane offsets can stay zero here.
    return VECTOR_ADD.format(t=t, k=k, block=128 * k, attrs=attrs)


@pytest.mark.parametrize("target", TARGETS)
def test_vector_add_with_vector_4_is_one_128_bit_load_per_operand(target):
    a = compile_ir(vector_add("f32", 4), target)
    assert ".visible .entry vadd(" in a.ptx and ".maxntid 128" in a.ptx and f".target {target}" in a.ptx
    assert a.ptx.count("ld.global.nc.v4.b32") == 2  # noalias + read-only -> the non-coherent path
    assert a.ptx.count("st.global.v4.b32") == 1
    assert "load <4 x float>, ptr addrspace(1)" in a.llvm_ir and "align 16" in a.llvm_ir


@pytest.mark.parametrize("target", TARGETS)
def test_pointers_that_may_alias_use_coherent_loads(target):
    a = compile_ir(vector_add("f32", 4, attrs=ATTRS), target)      # no `noalias` attribute: in-place launch
    assert "noalias" not in a.llvm_ir.split("define")[1].split("{")[0]
    assert a.ptx.count("ld.global.v4.b32") == 2 and "ld.global.nc" not in a.ptx
    assert a.num_threads == 128 and a.shared_bytes == 0 and a.kernel == "vadd"


@pytest.mark.parametrize("target", TARGETS)
def test_f16_vector_8_is_one_128_bit_access(target):
    a = compile_ir(vector_add("f16", 8), target)
    assert a.ptx.count("ld.global.nc.v4.b32") == 2 and a.ptx.count("st.global.v4.b32") == 1
    assert "add.rn.f16x2" in a.ptx or "add.f16x2" in a.ptx


@needs_ptxas
@pytest.mark.parametrize("target", TARGETS)
def test_ptxas_reports_registers_and_no_spills(target):
    a = compile_ir(vector_add("f32", 4), target)
    info = a.ptxas_info
    assert 0 < info["registers"] <= 32 and info["spill_stores"] == 0 and info["stack_frame"] == 0
    assert f"for '{target}'" in info["log"]


MASKED_GROUPS = f"""\
func @masked(%x: ptr<f32>, %out: ptr<f32>, %m: bool) {ATTRS} {{
  %tid = thread_id : i32
  %offs = pack %tid, %tid, %tid, %tid, %tid, %tid, %tid, %tid : regs<8xi32>
  %xs = splat %x : regs<8xptr<f32>>
  %xp = addptr %xs, %offs : regs<8xptr<f32>>
  %t = constant {{value = true}} : bool
  %mask = pack %m, %m, %m, %m, %t, %t, %t, %t : regs<8xbool>
  %minus = constant {{value = -1.0}} : regs<8xf32>
  %v = load %xp, %mask, %minus {{vector = 4}} : regs<8xf32>
  %os = splat %out : regs<8xptr<f32>>
  %op = addptr %os, %offs : regs<8xptr<f32>>
  store %op, %v, %mask {{vector = 4}}
  %s = extract %v {{index = 5}} : f32
  store %out, %s, %m
  return
}}
"""


@pytest.mark.parametrize("target", TARGETS)
def test_masks_guard_each_vector_group(target):
    a = compile_ir(MASKED_GROUPS, target)
    # group 0 follows %m (a branch or a predicate), group 1 is always on
    assert len(re.findall(r"ld\.global(\.nc)?\.v4\.b32", a.ptx)) == 2
    assert a.ptx.count("st.global.v4.b32") >= 2
    assert "@%p" in a.ptx
    assert "0fBF800000" in a.ptx  # `other` = -1.0 for the masked-off group
    assert "phi  <4 x float>" in a.llvm_ir  # the loaded group or `other`


LOOPS = f"""\
func @loops(%x: ptr<f32>, %out: ptr<f32>, %n: i32) {ATTRS} {{
  %zero = constant {{value = 0}} : i32
  %one = constant {{value = 1}} : i32
  %init = constant {{value = 0.0}} : f32
  %acc, %count = for %zero, %n, %one, %init, %zero : f32, i32 {{
  ^(%i: i32, %a: f32, %c: i32):
    %p = addptr %x, %i : ptr<f32>
    %v = load %p : f32
    %a2 = add %a, %v : f32
    %c2 = add %c, %one : i32
    yield %a2, %c2
  }}
  %left = while %n : i32 {{
  ^(%k: i32):
    %go = cmp %k, %zero {{pred = "gt"}} : bool
    condition %go, %k
  }} {{
  ^(%k_1: i32):
    %next = sub %k_1, %one : i32
    yield %next
  }}
  %cf = cast %count : f32
  %lf = cast %left : f32
  %big = cmp %acc, %cf {{pred = "gt"}} : bool
  %r = if %big : f32 {{
    %s = add %acc, %lf : f32
    yield %s
  }} {{
    %d = sub %acc, %cf : f32
    yield %d
  }}
  store %out, %r
  return
}}
"""


@pytest.mark.parametrize("target", TARGETS)
def test_for_while_and_if_become_loops_and_phis(target):
    a = compile_ir(LOOPS, target)
    assert "phi" in a.llvm_ir and "for.header" in a.llvm_ir and "while.cond" in a.llvm_ir
    assert "if.then" in a.llvm_ir and "if.else" in a.llvm_ir
    assert re.search(r"\bbra(\.uni)?\b", a.ptx)  # the for loop's back edge survives O3
    assert "ld.global.nc.b32" in a.ptx or "ld.global.b32" in a.ptx


NEGATIVE_STEP = f"""\
func @countdown(%out: ptr<i64>, %n: i64) {ATTRS} {{
  %zero = constant {{value = 0}} : i64
  %step = constant {{value = -2}} : i64
  %total = for %n, %zero, %step, %zero : i64 {{
  ^(%i: i64, %t: i64):
    %t2 = add %t, %i : i64
    yield %t2
  }}
  store %out, %total
  return
}}
"""


def test_for_with_a_negative_step_counts_down():
    a = compile_ir(NEGATIVE_STEP, "sm_80")
    assert "icmp sgt i64" in a.llvm_ir and "nsw" in a.llvm_ir


BLOCK_SUM = """\
func @block_sum(%x: ptr<f32>, %out: ptr<f32>) attributes {num_threads = 128, shared_bytes = 16, warp_size = 32} {
  %tid = thread_id : i32
  %pid = program_id {axis = 0} : i32
  %c128 = constant {value = 128} : i32
  %base = mul %pid, %c128 : i32
  %i = add %base, %tid : i32
  %xp = addptr %x, %i : ptr<f32>
  %v0 = load %xp : f32
  %c16 = constant {value = 16} : i32
  %s16 = shuffle %v0, %c16 {mode = "bfly"} : f32
  %v1 = add %v0, %s16 : f32
  %c8 = constant {value = 8} : i32
  %s8 = shuffle %v1, %c8 {mode = "bfly"} : f32
  %v2 = add %v1, %s8 : f32
  %c4 = constant {value = 4} : i32
  %s4 = shuffle %v2, %c4 {mode = "bfly"} : f32
  %v3 = add %v2, %s4 : f32
  %c2 = constant {value = 2} : i32
  %s2 = shuffle %v3, %c2 {mode = "bfly"} : f32
  %v4 = add %v3, %s2 : f32
  %c1 = constant {value = 1} : i32
  %s1 = shuffle %v4, %c1 {mode = "bfly"} : f32
  %v5 = add %v4, %s1 : f32
  %c32 = constant {value = 32} : i32
  %warp = div %tid, %c32 : i32
  %lane = rem %tid, %c32 : i32
  %zero = constant {value = 0} : i32
  %leader = cmp %lane, %zero {pred = "eq"} : bool
  %smem = shared_alloc {bytes = 16, offset = 0} : ptr<f32, shared>
  %slot = addptr %smem, %warp : ptr<f32, shared>
  store %slot, %v5, %leader
  barrier
  %first = cmp %tid, %zero {pred = "eq"} : bool
  if %first {
    %c4w = constant {value = 4} : i32
    %init = constant {value = 0.0} : f32
    %total = for %zero, %c4w, %c1, %init : f32 {
    ^(%w: i32, %acc: f32):
      %sp = addptr %smem, %w : ptr<f32, shared>
      %part = load %sp : f32
      %acc2 = add %acc, %part : f32
      yield %acc2
    }
    %outp = addptr %out, %pid : ptr<f32>
    store %outp, %total
    yield
  } {
    yield
  }
  return
}
"""


@pytest.mark.parametrize("target", TARGETS)
def test_block_reduction_uses_shuffles_shared_memory_and_a_barrier(target):
    a = compile_ir(BLOCK_SUM, target)
    assert a.ptx.count("shfl.sync.bfly.b32") == 5
    assert "bar.sync" in a.ptx or "barrier.sync" in a.ptx
    assert ".extern .shared .align 16 .b8 global_smem[]" in a.ptx
    assert "st.shared.b32" in a.ptx and "ld.shared" in a.ptx
    assert a.shared_bytes == 16


SHUFFLES = f"""\
func @shuffles(%out64: ptr<f64>, %out16: ptr<f16>, %outb: ptr<bool>, %x: f64, %h: f16, %b: bool) {ATTRS} {{
  %lane = constant {{value = 3}} : i32
  %x1 = shuffle %x, %lane {{mode = "idx", width = 8}} : f64
  %h1 = shuffle %h, %lane {{mode = "up"}} : f16
  %b1 = shuffle %b, %lane {{mode = "down", width = 16}} : bool
  store %out64, %x1
  store %out16, %h1
  store %outb, %b1
  return
}}
"""


@pytest.mark.parametrize("target", TARGETS)
def test_shuffles_split_64_bit_values_and_widen_narrow_ones(target):
    a = compile_ir(SHUFFLES, target)
    assert a.ptx.count("shfl.sync.idx.b32") == 2       # f64 as two halves
    assert "shfl.sync.up.b32" in a.ptx and "shfl.sync.down.b32" in a.ptx
    # width 8 -> segment mask (32 - 8) << 8 | 31 = 6175; up over the whole warp clamps at 0;
    # down with width 16 -> 16 << 8 | 31 = 4127
    assert "6175" in a.ptx and "4127" in a.ptx


MATH = """\
func @math(%x: ptr<{t}>, %out: ptr<{t}>) {attrs} {{
  %v = load %x : {t}
{body}
  return
}}
"""
MATH_FUNCTIONS = ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh", "erf", "sigmoid",
                  "floor", "ceil")


def math_kernel(t: str, functions=MATH_FUNCTIONS) -> str:
    body = "\n".join(f"  %{f} = {f} %v : {t}\n  %i_{f} = constant {{value = {i}}} : i32\n"
                     f"  %o_{f} = addptr %out, %i_{f} : ptr<{t}>\n  store %o_{f}, %{f}"
                     for i, f in enumerate(functions))
    return MATH.format(t=t, attrs=ATTRS, body=body)


@needs_libdevice
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("t", ["f32", "bf16"])
def test_math_functions_inline_libdevice(target, t):
    a = compile_ir(math_kernel(t), target)
    assert "__nv_expf" in a.libdevice_functions and "__nv_erff" in a.libdevice_functions
    assert "__nv_" not in a.ptx and ".func" not in a.ptx  # linked, inlined, and the rest dropped
    assert "sqrt.rn.f32" in a.ptx and "cvt.rmi.f32.f32" in a.ptx and "cvt.rpi.f32.f32" in a.ptx


@pytest.mark.parametrize("target", TARGETS)
def test_math_without_libdevice_uses_hardware_approximations(target):
    functions = [f for f in MATH_FUNCTIONS if f != "erf"]
    a = compile_ir(math_kernel("f32", functions), target, libdevice=False)
    for instruction in ("ex2.approx.f32", "lg2.approx.f32", "sin.approx.f32", "cos.approx.f32",
                        "tanh.approx.f32", "rsqrt.approx.f32"):
        assert instruction in a.ptx
    assert not a.libdevice_functions


def test_math_that_needs_libdevice_is_a_clean_error_without_it():
    with pytest.raises(CodegenError, match=r"`erf` on f32 needs CUDA's libdevice"):
        compile_ir(math_kernel("f32", ["erf"]), "sm_80", libdevice=False)
    with pytest.raises(CodegenError, match=r"`exp` on f64 needs CUDA's libdevice"):
        compile_ir(math_kernel("f64", ["exp"]), "sm_80", libdevice=False)
    a = compile_ir(math_kernel("f64", ["sqrt", "rsqrt", "floor"]), "sm_80", libdevice=False)
    assert "sqrt.rn.f64" in a.ptx and ("rcp.rn.f64" in a.ptx or "div.rn.f64" in a.ptx)  # exact 1 / sqrt


CASTS = f"""\
func @casts(%x: ptr<f32>, %i8: ptr<i8>, %u16: ptr<u16>, %h: ptr<bf16>, %b: ptr<bool>, %i: ptr<i32>) {ATTRS} {{
  %v = load %x : f32
  %a = cast %v : i8
  store %i8, %a
  %u = cast %v : u16
  store %u16, %u
  %n = load %i : i32
  %bf = cast %n : bf16
  store %h, %bf
  %nz = cast %v : bool
  store %b, %nz
  return
}}
"""


@pytest.mark.parametrize("target", TARGETS)
def test_float_to_int_casts_saturate(target):
    a = compile_ir(CASTS, target)
    assert "llvm.fptosi.sat.i8.f32" in a.llvm_ir and "llvm.fptoui.sat.i16.f32" in a.llvm_ir
    assert "fcmp une float" in a.llvm_ir  # NaN -> bool is true, like x != 0
    # saturation: NaN test and clamps around a truncating convert
    assert "cvt.rzi" in a.ptx and ("setp.nan.f32" in a.ptx or "setp.num.f32" in a.ptx)
    if target == "sm_80":  # no direct int -> bf16 convert: round to odd in f32, then to bf16
        assert "cvt.rz.f32.s32" in a.ptx and "cvt.rn.bf16.f32" in a.ptx
    else:
        assert "cvt.rn.bf16.s32" in a.ptx


INT_DIVISION = f"""\
func @divide(%x: ptr<i32>, %n: i32, %d: i32, %s: u8) {ATTRS} {{
  %q = div %n, %d : i32
  %r = rem %n, %d : i32
  %l = shl %n, %d : i32
  %rr = shr %n, %d : i32
  %one = constant {{value = 1}} : i32
  %x1 = addptr %x, %one : ptr<i32>
  %x2 = addptr %x1, %one : ptr<i32>
  %x3 = addptr %x2, %one : ptr<i32>
  store %x, %q
  store %x1, %r
  store %x2, %l
  store %x3, %rr
  return
}}
"""


ATOMICS = """\
func @atomics(%p: ptr<f32>, %counts: ptr<i32>, %v: f32, %m: bool) attributes {num_threads = 128, shared_bytes = 8, warp_size = 32} {
  %tid = thread_id : i32
  %offs = pack %tid, %tid : regs<2xi32>
  %ps = splat %p : regs<2xptr<f32>>
  %pp = addptr %ps, %offs : regs<2xptr<f32>>
  %vs = splat %v : regs<2xf32>
  %ms = splat %m : regs<2xbool>
  %old = atomic_rmw %pp, %vs, %ms {kind = "add"} : regs<2xf32>
  %one = constant {value = 1} : i32
  %n = atomic_rmw %counts, %one {kind = "max"} : i32
  %smem = shared_alloc {bytes = 8, offset = 0} : ptr<i32, shared>
  %s = atomic_rmw %smem, %n {kind = "add"} : i32
  %seen = atomic_cas %counts, %s, %one : i32
  %o = extract %old {index = 1} : f32
  store %p, %o
  return
}
"""


@pytest.mark.parametrize("target", TARGETS)
def test_atomics_are_acquire_release_at_gpu_scope(target):
    a = compile_ir(ATOMICS, target)
    assert a.ptx.count("atom.global.add.f32") == 2  # one per register, each under its mask
    assert "atom.global.max.s32" in a.ptx and "atom.shared.add.u32" in a.ptx
    assert "atom.acq_rel.gpu.global.cas.b32" in a.ptx
    assert "fence.acq_rel.gpu" in a.ptx  # around the relaxed atom of each atomic_rmw


def test_integer_division_and_shifts_are_guarded():
    a = compile_ir(INT_DIVISION, "sm_80")
    assert "sdiv i32" in a.llvm_ir and "srem i32" in a.llvm_ir
    assert "icmp uge i32" in a.llvm_ir  # shift amounts outside [0, 32)
    assert "select" in a.llvm_ir


def test_bool_parameters_are_bytes_and_pointers_are_noalias_only_when_listed():
    a = compile_ir(MASKED_GROUPS, "sm_80")
    assert "i8 %\"m\"" in a.llvm_ir or "i8 %m" in a.llvm_ir
    assert a.llvm_ir.count("ptr addrspace(1) noalias") == 0        # the IR promises nothing about aliasing
    listed = compile_ir(MASKED_GROUPS.replace("attributes {", "attributes {noalias = [0, 1], ", 1), "sm_80")
    assert listed.llvm_ir.count("ptr addrspace(1) noalias") == 2
    assert ".param .u8 masked_param_2" in a.ptx or ".param .b8 masked_param_2" in a.ptx


def test_isolated_compile_gives_the_same_ptx():
    text = vector_add("f32", 4)
    assert compile_ir(text, "sm_90a", isolate=True).ptx == compile_ir(text, "sm_90a", isolate=False).ptx


def test_target_from_the_function_attribute():
    text = vector_add("f32", 4).replace("warp_size = 32", 'target = "sm_90a", warp_size = 32')
    assert compile_ir(text, None).target == "sm_90a"
    with pytest.raises(CodegenError, match="lowered for target 'sm_90a' but is being compiled for sm_80"):
        compile_ir(text, "sm_80")


# -- clean errors, never a crash -------------------------------------------------------


@pytest.mark.parametrize("target, message", [
    ("gfx942", "gfx942 is an AMD GPU; the NVPTX backend compiles for NVIDIA targets"),
    ("sm_75", "unknown target 'sm_75'"),
    (None, "no target given"),
])
def test_unsupported_targets_are_lowering_errors(target, message):
    with pytest.raises(CodegenError, match=message):
        compile_ir(vector_add("f32", 4), target)


def test_a_target_llvm_does_not_know_is_rejected_before_llvm():
    from dataclasses import replace

    from tessera.ir.target import get_target
    bad_cpu = replace(get_target("sm_80"), llvm_cpu="sm_99x")
    with pytest.raises(CodegenError, match="LLVM CPU 'sm_99x'"):
        compile_ir(vector_add("f32", 4), bad_cpu)
    bad_feature = replace(get_target("sm_80"), llvm_features="+ptx99")
    with pytest.raises(CodegenError, match=r"'\+ptx99' is not a PTX ISA version"):
        compile_ir(vector_add("f32", 4), bad_feature)


@pytest.mark.parametrize("dtype", ["i4", "u2", "f4e2m1"])
def test_packed_accesses_left_for_the_backend_are_lowering_errors(dtype):
    text = f"""\
func @k(%x: ptr<{dtype}>) {ATTRS} {{
  %v = load %x : {dtype}
  store %x, %v
  return
}}
"""
    with pytest.raises(CodegenError, match=f"`load` through a pointer to packed {dtype} elements: the low-bit pass"):
        compile_ir(text, "sm_90a")


def test_small_floats_only_move_and_convert():
    moved = (f"func @k(%x: ptr<e8m0>, %y: ptr<f32>) {ATTRS} {{\n  %v = load %x : e8m0\n  %f = cast %v : f32\n"
             f"  store %y, %f\n  return\n}}\n")
    assert "ld.global.b8" in compile_ir(moved, "sm_90a").ptx
    added = moved.replace("%f = cast %v : f32", "%w = add %v, %v : e8m0\n  %f = cast %w : f32")
    with pytest.raises(CodegenError, match="`add` on e8m0: e8m0 values can only be loaded, stored, moved and cast"):
        compile_ir(added, "sm_90a")


@pytest.mark.parametrize("body, message", [
    ("%t = arange {end = 128, start = 0} : tile<128xi32>", "tile-level op"),
    ("%s = shared_alloc {bytes = 64, offset = -1} : ptr<f32, shared>", "unassigned"),
    ("%s = shared_alloc {bytes = 64, offset = 0} : ptr<f32, shared>", r"outside the kernel's shared memory"),
    ("%p = splat %x : regs<8xptr<f32>>\n  %v = load %p {vector = 8} : regs<8xf32>", "256-bit access"),
    ("%p = splat %x : regs<6xptr<f32>>\n  %v = load %p {vector = 4} : regs<6xf32>", "multiple of 4"),
    ("%l = constant {value = 1} : i32\n  %f = constant {value = 1.0} : f32\n"
     '  %s = shuffle %f, %l {mode = "bfly", width = 64} : f32', "exceeds the warp size"),
])
def test_unsupported_ops_and_attributes_are_lowering_errors(body, message):
    text = f"func @k(%x: ptr<f32>) {ATTRS} {{\n  {body}\n  return\n}}\n"
    with pytest.raises(CodegenError, match=message) as info:
        compile_ir(text, "sm_80")
    assert "kernel 'k'" in str(info.value)


@pytest.mark.parametrize("attrs, message", [
    ("{shared_bytes = 0, warp_size = 32}", "num_threads must be an int in"),
    ("{num_threads = 2048, warp_size = 32}", "num_threads must be an int in"),
    ("{num_threads = 128, warp_size = 64}", "sm_80 has 32 threads per warp"),
    ("{num_threads = 128, shared_bytes = 1000000}", "shared_bytes must be an int in"),
])
def test_function_attributes_are_checked(attrs, message):
    with pytest.raises(CodegenError, match=message):
        compile_ir(f"func @k() attributes {attrs} {{\n  return\n}}\n", "sm_80")


def test_malformed_ir_and_bad_parameters_are_lowering_errors():
    malformed = f"func @k(%x: f32) {ATTRS} {{\n  %y = add %x, %x : f16\n  return\n}}\n"
    with pytest.raises(CodegenError, match="malformed"):
        compile_ir(malformed, "sm_80")
    regs_param = f"func @k(%x: regs<4xf32>) {ATTRS} {{\n  return\n}}\n"
    with pytest.raises(CodegenError, match="parameters must be scalars or global pointers"):
        compile_ir(regs_param, "sm_80")


# LLVM's `Cannot select` on a libm call NVPTX has no instruction for: an abort inside LLVM.
ABORTING = {"kernel": "k", "triple": "nvptx64-nvidia-cuda", "cpu": "sm_80", "features": "+ptx80", "llvm_ir": """\
target triple = "nvptx64-nvidia-cuda"
declare float @llvm.sin.f32(float)
define ptx_kernel void @k(ptr addrspace(1) %p, float %x) {
  %y = call float @llvm.sin.f32(float %x)
  store float %y, ptr addrspace(1) %p
  ret void
}
"""}


def test_an_llvm_crash_in_the_isolated_child_is_a_backend_error():
    from tessera.backends.nvptx.compile import _run_llvm_isolated

    request = ABORTING
    with pytest.raises(BackendError, match="Cannot select") as info:
        _run_llvm_isolated(request)
    assert "crashed" in str(info.value) and "this process is unharmed" in str(info.value)
    with pytest.raises(BackendError, match="could not parse"):
        _run_llvm_isolated({**request, "llvm_ir": "this is not LLVM IR"})
