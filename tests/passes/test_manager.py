"""The pass manager runs passes in order, blames the pass that breaks the IR,
and records the IR after each pass."""

import pytest

from tessera.ir.errors import VerifyError
from tessera.ir.parser import parse_module
from tessera.ir.printer import print_module
from tessera.passes.manager import Pass, PassManager

KERNEL = """\
func @k(%x: f32) {
  %y = add %x, %x : f32
  return
}
"""


class SetWarps(Pass):
    """Changes the module in place and returns None."""

    name = "set_warps"

    def run(self, module):
        module.functions[0].attrs["num_warps"] = 8


class DropReturn:
    """Breaks the IR: the function body no longer ends with `return`."""

    name = "drop_return"

    def run(self, module):
        module.functions[0].body.ops.pop()


def reparse(module):
    """A plain function pass that returns a new module."""
    return parse_module(print_module(module))


def test_passes_run_in_order_and_dumps_record_the_ir_after_each():
    pm = PassManager([SetWarps(), reparse], dump=True)
    module = pm.run(parse_module(KERNEL))
    assert module.functions[0].attrs == {"num_warps": 8}
    assert [name for name, _ in pm.dumps] == ["input", "set_warps", "reparse"]
    assert pm.dumps[0][1] == KERNEL
    assert pm.dumps[1][1].startswith("func @k(%x: f32) attributes {num_warps = 8} {")


def test_dump_callable_sees_each_pass():
    seen = []
    PassManager([reparse], dump=lambda name, text: seen.append(name)).run(parse_module(KERNEL))
    assert seen == ["input", "reparse"]


def test_no_dumps_unless_asked():
    pm = PassManager([reparse])
    pm.run(parse_module(KERNEL))
    assert pm.dumps == []


def test_the_pass_that_breaks_the_ir_is_named():
    with pytest.raises(VerifyError, match="pass 'drop_return' produced invalid IR: @k: .*must end with `return`"):
        PassManager([SetWarps(), DropReturn()]).run(parse_module(KERNEL))


def test_invalid_input_is_not_blamed_on_a_pass():
    module = parse_module(KERNEL)
    module.functions[0].body.ops.pop()
    with pytest.raises(VerifyError, match="the input to the pass manager is invalid"):
        PassManager([SetWarps()]).run(module)


def test_verification_can_be_turned_off():
    module = PassManager([DropReturn()], verify_each=False).run(parse_module(KERNEL))
    assert [op.name for op in module.functions[0].body.ops] == ["add"]
