"""Tracing by hand: a kernel under construction whose arguments a test makes,
whose operators and builtins it calls directly, and whose IR it reads.

    t = Trace()
    x = t.arg("tile<64xi8>", "x")
    operators.binary(t.ctx, "+", x, 1)
    assert t.ir() == '''
        %0 = constant {value = 1} : tile<64xi8>
        %1 = add %x, %0 : tile<64xi8>
    '''
"""

from __future__ import annotations

import re
import textwrap

import pytest

import tessera.dsl.language  # noqa: F401  (registers the builtins)
from tessera.dsl.values import BUILTINS, Context, Tensor
from tessera.ir.builder import Builder
from tessera.ir.parser import parse_module
from tessera.ir.printer import print_function
from tessera.ir.types import Type
from tessera.ir.verifier import verify_function


def parse_type(text: str) -> Type:
    """The IR type spelled `text`, e.g. 'tile<64x32xbf16>' or 'ptr<f16>'."""
    return parse_module(f"func @t(%a: {text}) {{\n  return\n}}\n").functions[0].args[0].type


class Trace:
    def __init__(self):
        self.builder = Builder()
        self.function = self.builder.function("k", [])
        self.ctx = Context(self.builder, kernel_name="k")

    def arg(self, type_text: str, name: str) -> Tensor:
        """A kernel argument of the IR type spelled `type_text`."""
        return Tensor(self.function.body.add_arg(parse_type(type_text), name))

    def call(self, builtin: str, *args, **kwargs):
        """`tessera.<builtin>(*args, **kwargs)` as the code generator calls it."""
        return BUILTINS[builtin].impl(self.ctx, *args, **kwargs)

    def ir(self) -> str:
        """The ops emitted so far, as printed IR (one op per line, regions indented)."""
        lines = print_function(self.function).splitlines()[1:-1]
        return "\n".join(line[2:] for line in lines)

    def verify(self) -> None:
        self.builder.create("return")
        verify_function(self.function)


def ir_text(expected: str) -> str:
    """An expected-IR literal with its indentation and surrounding blank lines removed."""
    return textwrap.dedent(expected).strip("\n")


def raises(error_class, message: str):
    """pytest.raises for a CompileError whose message contains `message` literally."""
    return pytest.raises(error_class, match=re.escape(message))
