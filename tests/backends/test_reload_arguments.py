"""reload_kernel_arguments: a kernel argument used outside the entry block is loaded from the kernarg segment in
each block that uses it, at the offset the AMDGPU code object gives it; argument_cones: the values computed from
the arguments alone, which sink_vector_cones then recomputes where used (LLVM IR text in, out)."""

from __future__ import annotations

import re

import llvmlite.binding as llvm

from tessera.backends.llvm.reload_arguments import argument_cones, kernarg_layout, reload_kernel_arguments
from tessera.backends.llvm.sink_vectors import sink_vector_cones

# a persistent loop that reads pointer %x and writes %y each iteration; %n is an i32 between them (offset 8, and
# %y aligns up to 16 after the float at 12)
KERNEL = """\
define amdgpu_kernel void @k(ptr addrspace(1) noalias align 16 %x, i32 %n, float %s, ptr addrspace(1) %"y out") {
entry:
  %first = load float, ptr addrspace(1) %x, align 4
  br label %loop

loop:
  %i = phi i32 [ 0, %entry ], [ %i.next, %loop ]
  %p = getelementptr float, ptr addrspace(1) %x, i32 %i
  %v = load float, ptr addrspace(1) %p, align 4
  %q = getelementptr float, ptr addrspace(1) %x, i32 %n
  %w = fmul float %v, %s
  %o = getelementptr float, ptr addrspace(1) %"y out", i32 %i
  store float %w, ptr addrspace(1) %o, align 4
  %i.next = add i32 %i, 1
  %c = icmp slt i32 %i.next, %n
  br i1 %c, label %loop, label %exit

exit:
  ret void
}
"""


def test_each_block_loads_each_argument_it_uses_once_at_its_kernarg_offset():
    """Pointers and scalars alike: an i32 argument the entry loaded with three others (one s_load_dwordx4) and
    kept across the loop is a 128-bit SGPR range the allocator splits and spills."""
    after, loads = reload_kernel_arguments(KERNEL, "k")
    assert loads == 4
    llvm.parse_assembly(after).verify()
    entry, loop = after.split("\nloop:")[0], after.split("\nloop:")[1].split("\nexit:")[0]
    assert "%kernarg.segment = call ptr addrspace(4) @llvm.amdgcn.kernarg.segment.ptr()" in entry
    assert "load float, ptr addrspace(1) %x," in entry              # the entry keeps the argument itself
    assert re.findall(r"getelementptr inbounds i8, ptr addrspace\(4\) %kernarg.segment, i64 (\d+)", loop) == \
        ["0", "8", "12", "16"]
    assert re.findall(r"= load (\S+ \S+|\S+), ptr addrspace\(4\) %kernarg.addr\d+, align (\d)", loop) == \
        [("ptr addrspace(1)", "8"), ("i32", "4"), ("float", "4"), ("ptr addrspace(1)", "8")]
    for name in ("%x", '%"y out"', "%n", "%s"):                       # n: twice in the block, one load
        assert not re.search(re.escape(name) + r"\b", loop), name
    assert loop.count("!invariant.load") == 4 and "%q = getelementptr float, ptr addrspace(1) %kernarg.reload1" \
        in loop and "%c = icmp slt i32 %i.next, %kernarg.reload2" in loop


def test_the_layout_is_the_code_objects():
    """The offsets the pass computes are the ones the AMDGPU code generator puts in the kernel's metadata."""
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    target = llvm.Target.from_triple("amdgcn-amd-amdhsa")
    module = llvm.parse_assembly(KERNEL)
    module.triple = "amdgcn-amd-amdhsa"
    assembly = target.create_target_machine(cpu="gfx942").emit_assembly(module)
    metadata = {name: int(offset) for name, offset in re.findall(r"\.name:\s+(.+)\n\s+\.offset:\s+(\d+)", assembly)}
    layout = {name.strip('%"'): offset for name, (_, offset) in kernarg_layout(KERNEL.splitlines()[0]).items()}
    assert layout == metadata == {"x": 0, "n": 8, "s": 12, "y out": 16}


def test_kernels_it_cannot_lay_out_and_kernels_without_uses_are_untouched():
    vector = KERNEL.replace("float %s", "<2 x float> %s")
    assert kernarg_layout(vector.splitlines()[0]) is None and reload_kernel_arguments(vector, "k") == (vector, 0)
    assert reload_kernel_arguments(KERNEL, "other") == (KERNEL, 0)
    straight = "define amdgpu_kernel void @k(ptr addrspace(1) %x) {\nentry:\n  store i32 0, ptr addrspace(1) %x\n" \
               "  ret void\n}\n"
    assert reload_kernel_arguments(straight, "k") == (straight, 0)


# LICM's shape: bounds and addresses computed from the arguments alone, hoisted to the entry, used in the loop
HOISTED = """\
define amdgpu_kernel void @k(ptr addrspace(1) %x, i32 %n, i32 %m) {
entry:
  %end = add i32 %n, 63
  %tiles = sdiv i32 %end, 64
  %flag = getelementptr i8, ptr addrspace(1) %x, i64 12
  %wide = sext i32 %m to i64
  %area = mul i64 %wide, %wide
  %ratio = sdiv i32 %n, %m
  %first = load i32, ptr addrspace(1) %x, align 4
  %after = add i32 %first, %n
  %lanes = insertelement <2 x i32> poison, i32 %n, i64 0
  br label %loop

loop:
  %i = phi i32 [ 0, %entry ], [ %i.next, %loop ]
  %seen = load volatile i32, ptr addrspace(1) %flag, align 4
  %j = add i32 %i, %after
  %k = add i32 %j, %ratio
  %l = trunc i64 %area to i32
  %o = add i32 %k, %l
  store i32 %o, ptr addrspace(1) %x, align 4
  %i.next = add i32 %i, %seen
  %c = icmp slt i32 %i.next, %tiles
  br i1 %c, label %loop, label %exit

exit:
  ret void
}
"""


def test_values_of_the_arguments_alone_are_cones_and_nothing_else_is():
    """Cheap scalar instructions over arguments, constants and each other (a division by a constant is shifts);
    not a load's result or what uses it, not a division by a variable, not a 64-bit multiply, not a vector."""
    assert argument_cones(HOISTED, "k") == {"%end", "%tiles", "%flag", "%wide"}
    assert argument_cones(HOISTED, "other") == frozenset()


def test_a_cone_is_recomputed_in_the_loop_from_arguments_read_there():
    """The loop's copy of `%tiles` and `%flag` starts from the kernarg segment: nothing of the entry's is live
    across the loop but what is not a cone (`%after`, `%ratio`, `%area`)."""
    sunk, copies = sink_vector_cones(HOISTED, "k", also=argument_cones(HOISTED, "k"))
    after, loads = reload_kernel_arguments(sunk, "k")
    assert (copies, loads) == (3, 2)
    llvm.parse_assembly(after).verify()
    loop = after.split("\nloop:")[1].split("\nexit:")[0]
    assert re.search(r"%sunk1.flag = getelementptr i8, ptr addrspace\(1\) %kernarg.reload\d+, i64 12", loop)
    assert re.search(r"%sunk1.end = add i32 %kernarg.reload\d+, 63\n  %sunk1.tiles = sdiv i32 %sunk1.end, 64", loop)
    assert "%c = icmp slt i32 %i.next, %sunk1.tiles" in loop
    assert "%k = add i32 %j, %ratio" in loop and "%l = trunc i64 %area to i32" in loop
