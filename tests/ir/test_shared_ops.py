"""The explicit shared-memory tile ops (`tessera/ir/shared_ops.py`): their text round-trips through the
parser, and each wrong operand is rejected by the verifier with a message that says what the op takes."""

import pytest

from tessera.ir.errors import VerifyError
from tessera.ir.parser import parse_module
from tessera.ir.printer import print_module
from tessera.ir.verifier import verify_module

ARGS = "%a: ptr<f16>, %n: i32, %i: i32, %x: f32"
SETUP = ["%buf = smem_alloc : smem<2x16x32xf16>",
         "%one = constant {value = 1} : i32",
         "%v = make_view %a, %n, %n, %n, %one : view<f16, 2>",
         "%s = smem_slot %buf, %i : smem<16x32xf16>",
         "%p = splat %a : tile<16x32xptr<f16>>",
         "%m = constant {value = true} : tile<16x32xbool>",
         "%t = constant {value = 0.0} : tile<16x32xf16>",
         "%bars = smem_mbarriers : smem<2x1xi64>",
         "%bar = smem_slot %bars, %i : smem<1xi64>"]


def kernel(*body: str) -> str:
    return f"func @k({ARGS}) {{\n" + "".join(f"  {line}\n" for line in [*SETUP, *body, "return"]) + "}\n"


WELL_TYPED = kernel("smem_async_copy %s, %v, %i, %i", "smem_async_copy %s, %p, %m", "smem_async_copy %s, %p",
                    "smem_async_commit", "smem_async_wait {pending = 1}", "smem_barrier",
                    "%x1 = smem_load %s : tile<16x32xf16>", "smem_store %s, %x1",
                    "%whole = smem_load %buf : tile<2x16x32xf16>",
                    "smem_async_copy %s, %v, %i, %i, %bar", "smem_async_copy %s, %p, %m, %bar",
                    "smem_async_copy %s, %p, %bar", "smem_mbarrier_wait %bar, %i")


def test_the_ops_verify_and_print_parse_print_is_the_identity():
    module = parse_module(WELL_TYPED)
    verify_module(module)
    assert print_module(module) == WELL_TYPED
    assert print_module(parse_module(print_module(module))) == WELL_TYPED


@pytest.mark.parametrize("line, message", [
    ("%bad = smem_alloc : tile<16xf16>", r"smem_alloc produces a shared buffer \(smem<...>\), got tile<16xf16>"),
    ("%bad = smem_alloc : smem<16xu4>", "shared buffers hold elements of at least one byte"),
    ("%bad = smem_slot %s, %x : smem<32xf16>", "smem_slot index must be an integer scalar, got f32"),
    ("%bad = smem_slot %t, %i : smem<32xf16>", r"smem_slot needs a shared buffer \(smem<...>\), got tile"),
    ("%bad = smem_load %s : tile<32x16xf16>", r"smem_load must produce \(tile<16x32xf16>\)"),
    ("smem_store %s, %m", r"smem_store of tile<16x32xbool> into smem<16x32xf16>: the value must be "
                          r"tile<16x32xf16>"),
    ("smem_async_copy %buf, %v, %i, %i", "takes 3 element offsets"),
    ("smem_async_copy %s, %t", r"copies from a view \(and offsets\) or from a tile<16x32xptr<f16>>, got tile"),
    ("smem_async_copy %s, %p, %t", "mask must be bool"),
    ("smem_async_wait {pending = -1}", "pending must be >= 0"),
    ("%bad = smem_mbarriers : smem<2xi64>", r"an array of mbarriers, smem<N x 1 x i64>"),
    ("smem_async_copy %s, %v, %i, %i, %bars", r"completes on one mbarrier \(smem<1xi64>\), got smem<2x1xi64>"),
    ("smem_mbarrier_wait %s, %i", r"waits on one mbarrier \(smem<1xi64>.*got smem<16x32xf16>"),
    ("smem_mbarrier_wait %bar, %x", "parity must be an integer scalar, got f32"),
])
def test_wrong_operands_are_rejected(line, message):
    with pytest.raises(VerifyError, match=message):
        verify_module(parse_module(kernel(line)))
