"""Type rules of the mbarrier and TMA thread ops (`tessera/ir/bulk_async_ops.py`): each wrong operand is
rejected by the verifier with a message that says what the op takes."""

import pytest

from tessera.ir.errors import VerifyError
from tessera.ir.parser import parse_module
from tessera.ir.verifier import verify_module

ARGS = "%map: tensormap, %g: ptr<bf16>, %i: i32, %j: i64"
SETUP = ["%bar = shared_alloc {bytes = 8, offset = 0} : ptr<i64, shared>",
         "%box = shared_alloc {bytes = 8192, offset = 1024} : ptr<bf16, shared>",
         "%words = shared_alloc {bytes = 64, offset = 64} : ptr<i32, shared>"]


def kernel(*body: str) -> str:
    return f"func @k({ARGS}) {{\n" + "".join(f"  {line}\n" for line in [*SETUP, *body, "return"]) + "}\n"


def test_well_typed_ops_verify():
    verify_module(parse_module(kernel("mbarrier_init %bar, %i", "fence_mbarrier_init", "fence_proxy_async",
                                      "mbarrier_arrive_expect_tx %bar, %i", "mbarrier_expect_tx %bar, %i",
                                      "tma_load %box, %map, %i, %bar",
                                      "tma_load %box, %map, %i, %i, %i, %i, %i, %bar", "mbarrier_arrive %bar",
                                      "mbarrier_inval %bar",
                                      "mbarrier_wait %bar, %i", "tma_store %box, %map, %i, %i",
                                      "tma_store %box, %map, %i, %i, %i, %i, %i", "bulk_commit_group",
                                      "bulk_wait_group_read {pending = 1}")))


@pytest.mark.parametrize("line, message", [
    ("mbarrier_init %words, %i", r"mbarrier_init takes an mbarrier, a ptr<i64, shared> .*got ptr<i32, shared>"),
    ("mbarrier_init %bar, %j", "mbarrier_init arrival count must be i32, got i64"),
    ("mbarrier_arrive %g", "mbarrier_arrive takes an mbarrier"),
    ("mbarrier_arrive_expect_tx %bar, %j", "transaction byte count must be i32"),
    ("mbarrier_expect_tx %words, %i", "mbarrier_expect_tx takes an mbarrier"),
    ("mbarrier_wait %bar, %j", "mbarrier_wait phase parity must be i32"),
    ("tma_load %g, %map, %i, %bar", "tma_load writes a box into shared memory"),
    ("tma_load %box, %g, %i, %bar",
     r"tensor map, a tensormap kernel parameter \(the 128-byte CUtensorMap, passed by value\)"),
    ("tma_load %box, %map, %j, %bar", "tma_load coordinate 0 must be i32"),
    ("tma_load %box, %map, %i, %i, %i", r"tma_load \(last operand\) takes an mbarrier"),
    ("tma_load %box, %map, %i, %i, %i, %i, %i, %i, %bar", "tma_load takes 4 to 8 operands"),
    ("tma_store %g, %map, %i", "tma_store reads a box from shared memory"),
    ("tma_store %box, %g, %i", "tma_store's second operand is the tensor map"),
    ("tma_store %box, %map, %j", "tma_store coordinate 0 must be i32"),
    ("tma_store %box, %map, %i, %i, %i, %i, %i, %i", "tma_store takes 3 to 7 operands"),
    ("bulk_wait_group_read {pending = -1}", "bulk_wait_group_read pending must be >= 0, got -1"),
    ("bulk_wait_group {pending = -1}", "bulk_wait_group pending must be >= 0, got -1"),
])
def test_wrong_operands_are_rejected(line, message):
    with pytest.raises(VerifyError, match=message):
        verify_module(parse_module(kernel(line)))


def test_a_tensormap_is_only_a_kernel_parameter():
    carried = kernel("%c0 = constant {value = 0} : i32", "%c1 = constant {value = 1} : i32",
                     "%m2 = for %c0, %c1, %c1, %map : tensormap {", "^(%k: i32, %m: tensormap):", "  yield %m", "}")
    with pytest.raises(VerifyError, match="a tensormap is passed by value as a kernel parameter"):
        verify_module(parse_module(carried))
