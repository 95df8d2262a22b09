"""Type rules of the warp-specialization thread ops (`tessera/ir/warp_specialization_ops.py`): setmaxnreg's
count and action, named_barrier's id and count; each wrong attribute is rejected saying what the op takes."""

import pytest

from tessera.ir.errors import VerifyError
from tessera.ir.parser import parse_module
from tessera.ir.printer import print_module
from tessera.ir.verifier import verify_module


def kernel(*body: str) -> str:
    return "func @k() attributes {num_threads = 384} {\n" + "".join(f"  {line}\n" for line in [*body, "return"]) \
        + "}\n"


def test_well_formed_ops_verify_and_round_trip():
    text = kernel('setmaxnreg {action = "dec", count = 24}', 'setmaxnreg {action = "inc", count = 256}',
                  "%e = elect_sync : bool", "named_barrier {count = 256, id = 1}", "named_barrier {count = 32, id = 15}")
    module = parse_module(text)
    verify_module(module)
    assert print_module(module) == text


@pytest.mark.parametrize("line, message", [
    ('setmaxnreg {action = "dec", count = 20}', r"setmaxnreg count is a multiple of 8 in \[24, 256\].*got 20"),
    ('setmaxnreg {action = "inc", count = 264}', r"multiple of 8 in \[24, 256\].*got 264"),
    ('setmaxnreg {action = "inc", count = 100}', "got 100"),
    ('setmaxnreg {action = "up", count = 232}', r"setmaxnreg action is \"inc\".*or \"dec\".*got 'up'"),
    ("setmaxnreg {count = 232}", "setmaxnreg needs attribute 'action'"),
    ("%e = elect_sync : i32", "elect_sync"),
    ("named_barrier {count = 256, id = 0}", r"named_barrier id is in 1..15 \(barrier 0 is the block-wide `barrier`\)"),
    ("named_barrier {count = 256, id = 16}", "named_barrier id is in 1..15"),
    ("named_barrier {count = 48, id = 1}", r"whole warps' threads: a multiple of 32 in \[32, 1024\], got 48"),
    ("named_barrier {count = 0, id = 1}", "got 0"),
])
def test_wrong_attributes_are_rejected(line, message):
    with pytest.raises(VerifyError, match=message):
        verify_module(parse_module(kernel(line)))
