"""async_copy / async_commit / async_wait -> cp.async in PTX, assembled for sm_80 and sm_90a."""

import dataclasses
import re

import pytest

from tessera.backends.nvptx import compile_thread_ir, find_ptxas
from tessera.backends.nvptx.errors import CodegenError
from tessera.ir.parser import parse_module
from tessera.ir.target import get_target
from tessera.ir.verifier import verify_module

KERNEL = """\
func @stage(%x: ptr<f32>, %out: ptr<f32>, %n: i32) attributes {num_threads = 32, shared_bytes = 1024} {
  %tid = thread_id : i32
  %c4 = constant {value = 4} : i32
  %c2 = constant {value = 2} : i32
  %c1 = constant {value = 1} : i32
  %o = mul %tid, %c4 : i32
  %o8 = mul %tid, %c2 : i32
  %in = cmp %o, %n {pred = "lt"} : bool
  %smem = shared_alloc {bytes = 512, offset = 0} : ptr<f32, shared>
  %small = shared_alloc {bytes = 512, offset = 512} : ptr<f32, shared>
  %s = addptr %smem, %o : ptr<f32, shared>
  %g = addptr %x, %o : ptr<f32>
  async_copy %s, %g, %in {bytes = 16}
  async_commit
  %s8 = addptr %small, %o8 : ptr<f32, shared>
  %g8 = addptr %x, %o8 : ptr<f32>
  async_copy %s8, %g8, %in {bytes = 8}
  %s4 = addptr %small, %tid : ptr<f32, shared>
  async_copy %s4, %x, %in {bytes = 4}
  async_commit
  async_wait {pending = 1}
  async_wait {pending = 0}
  barrier
  %v = load %s : f32
  %dst = addptr %out, %tid : ptr<f32>
  store %dst, %v
  return
}
"""


def kernel():
    module = parse_module(KERNEL)
    verify_module(module)
    return module.functions[0]


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_cp_async_in_ptx_and_assembles(target):
    artifacts = compile_thread_ir(kernel(), target, assemble=find_ptxas() is not None)
    ptx = artifacts.ptx
    assert "cp.async.cg.shared.global" in ptx
    assert "cp.async.ca.shared.global" in ptx
    assert "cp.async.commit_group" in ptx
    assert re.search(r"cp\.async\.wait_group\s+1;", ptx) and re.search(r"cp\.async\.wait_group\s+0;", ptx)
    if find_ptxas() is not None:
        assert artifacts.cubin


def test_cp_async_needs_the_cp_async_feature():
    without = dataclasses.replace(get_target("sm_80"), features=frozenset({"shfl", "mma.sync", "ldmatrix"}))
    with pytest.raises(CodegenError, match="needs cp.async"):
        compile_thread_ir(kernel(), without, assemble=False)
