"""The warpgroup ops' type rules: one line of IR each, accepted or rejected with the message a user sees."""

import pytest

from tessera.ir.errors import VerifyError
from tessera.ir.parser import parse_module
from tessera.ir.verifier import verify_module

ARGS = ("%p: ptr<bf16, shared>, %g: ptr<bf16>, %d: i64, %i: i32, %c: regs<32xf32>, %c8: regs<4xf32>, "
        "%r: regs<8xbf16>, %r4: regs<4xbf16>")


def verify(*body: str) -> None:
    verify_module(parse_module(f"func @k({ARGS}) {{\n" + "".join(f"  {line}\n" for line in body) + "  return\n}\n"))


def test_well_typed_ops():
    verify("%a = wgmma_desc %p {lbo = 16, sbo = 1024, swizzle = 128} : i64",
           "wgmma_fence",
           '%e = wgmma %a, %d, %c {dtype = "bf16", k = 16, m = 64, n = 64} : regs<32xf32>',
           '%f = wgmma %a, %a, %c8 {dtype = "f16", k = 16, m = 64, n = 8, trans_b = true} : regs<4xf32>',
           '%h = wgmma %r, %d, %c {dtype = "bf16", k = 16, m = 64, n = 64, trans_b = true} : regs<32xf32>',
           # a stack of two m64n32 fragments, each wgmma updating its own
           '%s0 = wgmma %a, %d, %c {dtype = "bf16", k = 16, m = 64, n = 32, offset = 0} : regs<32xf32>',
           '%s1 = wgmma %a, %d, %s0 {dtype = "bf16", k = 16, m = 64, n = 32, offset = 16} : regs<32xf32>',
           "wgmma_commit", "wgmma_wait {pending = 1}", "fence_proxy_async")


@pytest.mark.parametrize("line, message", [
    ('%e = wgmma %d, %d, %c {dtype = "bf16", k = 16, m = 64, n = 48} : regs<32xf32>',
     "accumulates into regs<24xf32> (the wgmma_accumulator(48) fragment), got regs<32xf32>"),
    ('%e = wgmma %d, %d, %c {dtype = "bf16", k = 16, m = 64, n = 32, offset = 24} : regs<32xf32>',
     "wgmma with offset = 24 updates registers 24..39 of a stack of regs<16xf32> fragments: the offset must be a "
     "multiple of 16 inside the accumulator, got regs<32xf32>"),
    ('%e = wgmma %d, %d, %c {dtype = "bf16", k = 16, m = 64, n = 32, offset = 32} : regs<32xf32>',
     "the offset must be a multiple of 16 inside the accumulator"),
    ('%e = wgmma %d, %d, %c {dtype = "bf16", k = 16, m = 64, n = 264} : regs<32xf32>',
     "wgmma shape is m64nNk16 with N in 8, 16, ..., 256; got m = 64, n = 264, k = 16"),
    ('%e = wgmma %d, %d, %c {dtype = "bf16", k = 8, m = 64, n = 64} : regs<32xf32>', "wgmma shape is m64nNk16"),
    ('%e = wgmma %d, %d, %c {dtype = "f32", k = 16, m = 64, n = 64} : regs<32xf32>',
     "wgmma multiplies f16 x f16, bf16 x bf16 or e4m3/e5m2 x e4m3/e5m2, got dtype = 'f32'"),
    ('%e = wgmma %i, %d, %c {dtype = "bf16", k = 16, m = 64, n = 64} : regs<32xf32>',
     "wgmma reads B through an i64 matrix descriptor (wgmma_desc) and A through one or from registers "
     "(regs<8xbf16>, f16/bf16 only: the `wgmma_a_fragment()` of a 64 x 16 slice); got i32 and i64"),
    ('%e = wgmma %r4, %d, %c {dtype = "bf16", k = 16, m = 64, n = 64} : regs<32xf32>', "got regs<4xbf16> and i64"),
    ('%e = wgmma %r, %d, %c {dtype = "f16", k = 16, m = 64, n = 64} : regs<32xf32>', "(regs<8xf16>, f16/bf16"),
    ('%e = wgmma %d, %r, %c {dtype = "bf16", k = 16, m = 64, n = 64} : regs<32xf32>', "got i64 and regs<8xbf16>"),
    ('%e = wgmma %r, %d, %c {dtype = "bf16", k = 16, m = 64, n = 64, trans_a = true} : regs<32xf32>',
     "wgmma with A in registers has no trans_a"),
    ('%e = wgmma %d, %d, %c {dtype = "bf16", k = 16, n = 64} : regs<32xf32>', "wgmma needs attribute 'm'"),
    ("%a = wgmma_desc %g {lbo = 16, sbo = 1024, swizzle = 128} : i64",
     "wgmma_desc describes a tile in shared memory: its operand is a ptr<T, shared>, got ptr<bf16>"),
    ("%a = wgmma_desc %p {lbo = 16, sbo = 1024, swizzle = 96} : i64", "wgmma_desc swizzle is one of [0, 32, 64, 128]"),
    ("%a = wgmma_desc %p {lbo = 8, sbo = 1024, swizzle = 128} : i64", "lbo = 8 must be a multiple of 16"),
    ("wgmma_wait {pending = 8}", "wgmma_wait pending must be in [0, 7], got 8"),
])
def test_rejected(line, message):
    with pytest.raises(VerifyError) as err:
        verify(line)
    assert message in str(err.value)
