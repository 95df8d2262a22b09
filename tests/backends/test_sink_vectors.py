"""sink_vector_cones: a cheap vector value used in another block is recomputed there (LLVM IR text in, out)."""

from __future__ import annotations

import re

import llvmlite.binding as llvm

from tessera.backends.llvm.sink_vectors import sink_vector_cones

# LICM's shape: the splat of %s and the mask built on it were hoisted out of the loop that uses them
BEFORE = """\
define amdgpu_kernel void @k(ptr addrspace(1) %p, i32 %s, i32 %n) {
entry:
  %a = insertelement <1 x i32> poison, i32 %s, i64 0
  %b = shufflevector <1 x i32> %a, <1 x i32> poison, <4 x i32> zeroinitializer
  %m = icmp slt <4 x i32> %b, <i32 0, i32 1, i32 2, i32 3>
  %0 = add <4 x i32> %b, splat (i32 7)
  br label %loop

loop:
  %i = phi i32 [ 0, %entry ], [ %i.next, %loop ]
  %keep = phi <4 x i32> [ %b, %entry ], [ %w, %loop ]
  %v = load <4 x i32>, ptr addrspace(1) %p, align 16
  %w = add <4 x i32> %v, %0
  %x = select <4 x i1> %m, <4 x i32> %w, <4 x i32> %keep
  store <4 x i32> %x, ptr addrspace(1) %p, align 16
  %i.next = add i32 %i, 1
  %c = icmp slt i32 %i.next, %n
  br i1 %c, label %loop, label %exit

exit:
  ret void
}
"""

LOOP_AFTER = """\
loop:
  %i = phi i32 [ 0, %entry ], [ %i.next, %loop ]
  %keep = phi <4 x i32> [ %b, %entry ], [ %w, %loop ]
  %v = load <4 x i32>, ptr addrspace(1) %p, align 16
  %sunk1.a = insertelement <1 x i32> poison, i32 %s, i64 0
  %sunk1.b = shufflevector <1 x i32> %sunk1.a, <1 x i32> poison, <4 x i32> zeroinitializer
  %sunk1.0 = add <4 x i32> %sunk1.b, splat (i32 7)
  %w = add <4 x i32> %v, %sunk1.0
  %sunk1.m = icmp slt <4 x i32> %sunk1.b, <i32 0, i32 1, i32 2, i32 3>
  %x = select <4 x i1> %sunk1.m, <4 x i32> %w, <4 x i32> %keep
  store <4 x i32> %x, ptr addrspace(1) %p, align 16
  %i.next = add i32 %i, 1
  %c = icmp slt i32 %i.next, %n
  br i1 %c, label %loop, label %exit
"""


def test_each_cheap_vector_is_recomputed_once_in_the_block_that_uses_it():
    after, copies = sink_vector_cones(BEFORE, "k")
    assert copies == 4
    assert LOOP_AFTER in after
    entry = after.split("loop:")[0]
    assert "%b = shufflevector" in entry and "%0 = add" in entry      # the originals stay (the phi uses %b)
    # the phi's operand is read at the end of the entry block: it keeps the original
    assert "%keep = phi <4 x i32> [ %b, %entry ]" in after
    module = llvm.parse_assembly(after)     # valid IR: names of numbered values get a prefix (%sunk1.0)
    module.verify()


def test_scalars_and_same_block_uses_are_left_alone():
    text = BEFORE.replace("%w = add <4 x i32> %v, %0", "%w = add <4 x i32> %v, %v") \
        .replace("%x = select <4 x i1> %m,", "%x = select <4 x i1> <i1 1, i1 1, i1 1, i1 1>,")
    after, copies = sink_vector_cones(text, "k")
    assert (after, copies) == (text, 0)


def test_another_function_or_a_missing_kernel_is_untouched():
    assert sink_vector_cones(BEFORE, "other") == (BEFORE, 0)


def test_a_boolean_is_recomputed_but_a_multiply_is_not():
    """A scalar comparison (a lane mask on AMD) moves like a vector; a product stays where it is (a 64-bit
    multiply is four instructions a lane), and what is built on it moves with it as an operand."""
    text = BEFORE.replace("%0 = add <4 x i32> %b, splat (i32 7)",
                          "%0 = mul <4 x i32> %b, splat (i32 7)\n  %e = icmp eq i32 %s, 0\n  %f = and i1 %e, true") \
        .replace("%c = icmp slt i32 %i.next, %n", "%c0 = icmp slt i32 %i.next, %n\n  %c = and i1 %c0, %f")
    after, _ = sink_vector_cones(text, "k")
    loop = after.split("loop:")[1]
    assert "%sunk1.e = icmp eq i32 %s, 0\n  %sunk1.f = and i1 %sunk1.e, true\n  %c = and i1 %c0, %sunk1.f" in loop
    assert "%w = add <4 x i32> %v, %0\n" in loop and "mul" not in loop
    llvm.parse_assembly(after).verify()


def test_a_kernel_attribute_joins_its_attribute_group():
    from tessera.backends.llvm.sink_vectors import with_kernel_attribute
    grouped = BEFORE.replace("i32 %n) {", "i32 %n) local_unnamed_addr #0 {") + \
        'attributes #0 = { "amdgpu-flat-work-group-size"="1,256" }\n'
    added = with_kernel_attribute(grouped, "k", '"amdgpu-sched-strategy"="iterative-minreg"')
    assert 'attributes #0 = { "amdgpu-sched-strategy"="iterative-minreg" "amdgpu-flat-work-group-size"="1,256" }' \
        in added
    inline = with_kernel_attribute(BEFORE, "k", '"a"="b"')
    assert 'i32 %n) "a"="b" {' in inline
    for text in (added, inline):
        llvm.parse_assembly(text).verify()


def test_the_spill_counts_are_read_from_the_kernels_metadata():
    from tessera.backends.llvm.optimize import _spills
    assembly = "\t.amdhsa_kernel k\n    .sgpr_count:     106\n    .sgpr_spill_count: 48\n    .vgpr_spill_count: 2\n"
    assert _spills(assembly) == (2, 48)
    assert _spills("\t.entry k\n") == (0, 0)       # PTX, or a kernel without the counts: nothing spilled


# a tile of booleans read from LDS, the barrier, then the tile's use: the loaded bytes are VGPRs, the compared
# lanes SGPR pairs (wave64 lane masks) held across the barrier
BARRIER = """\
define amdgpu_kernel void @k(ptr addrspace(3) %lds, ptr addrspace(1) %out) {
entry:
  %a = load i8, ptr addrspace(3) %lds, align 1
  %0 = icmp ne i8 %a, 0
  %1 = insertelement <2 x i1> poison, i1 %0, i64 0
  %b = load i8, ptr addrspace(3) %lds, align 1
  %2 = icmp ne i8 %b, 0
  %mask = insertelement <2 x i1> %1, i1 %2, i64 1
  %early = icmp eq i8 %a, %b
  %held = select i1 %early, i32 1, i32 2
  fence syncscope("workgroup") release
  tail call void @llvm.amdgcn.s.barrier()
  fence syncscope("workgroup") acquire
  %3 = select <2 x i1> %mask, <2 x i32> splat (i32 1), <2 x i32> zeroinitializer
  store <2 x i32> %3, ptr addrspace(1) %out, align 8
  store i32 %held, ptr addrspace(1) %out, align 4
  ret void
}

declare void @llvm.amdgcn.s.barrier()
"""


def test_past_barriers_a_mask_is_computed_after_the_barrier_its_use_follows():
    """The compares and the vector built of them move past the barrier (recomputed there, the originals gone:
    instruction selection would merge a copy with its original, which keeps the first one's place); the loads
    stay, and so does a compare used before the barrier. Numbered values keep their order (a copy is named)."""
    assert sink_vector_cones(BARRIER, "k") == (BARRIER, 0)
    after, copies = sink_vector_cones(BARRIER, "k", past_barriers=True)
    assert copies == 4
    llvm.parse_assembly(after).verify()
    before, past = after.split("tail call void @llvm.amdgcn.s.barrier()")
    assert "icmp ne" not in before and "insertelement" not in before
    assert "%a = load i8" in before and "%early = icmp eq i8 %a, %b" in before
    assert re.findall(r"^  (%\S+) = (icmp ne|insertelement)", past, re.M) == [
        ("%sunk3.0", "icmp ne"), ("%sunk3.1", "insertelement"), ("%sunk3.2", "icmp ne"),
        ("%sunk3.mask", "insertelement")]
    assert "%3 = select <2 x i1> %sunk3.mask," in past
