"""reload_kernel_arguments: a pointer argument used outside the entry block is loaded from the kernarg segment in
each block that uses it, at the offset the AMDGPU code object gives it (LLVM IR text in, out)."""

from __future__ import annotations

import re

import llvmlite.binding as llvm

from tessera.backends.llvm.reload_arguments import kernarg_layout, reload_kernel_arguments

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


def test_each_block_loads_each_pointer_it_uses_once_at_its_kernarg_offset():
    after, loads = reload_kernel_arguments(KERNEL, "k")
    assert loads == 2
    llvm.parse_assembly(after).verify()
    entry, loop = after.split("\nloop:")[0], after.split("\nloop:")[1].split("\nexit:")[0]
    assert "%kernarg.segment = call ptr addrspace(4) @llvm.amdgcn.kernarg.segment.ptr()" in entry
    assert "load float, ptr addrspace(1) %x," in entry              # the entry keeps the argument itself
    assert re.findall(r"getelementptr inbounds i8, ptr addrspace\(4\) %kernarg.segment, i64 (\d+)", loop) == \
        ["0", "16"]
    assert "%x" not in loop and '%"y out"' not in loop                # x: twice in the block, one load
    assert loop.count("!invariant.load") == 2 and "%q = getelementptr float, ptr addrspace(1) %kernarg.reload1" \
        in loop


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
