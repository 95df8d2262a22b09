"""Exceptions raised by the IR layer.

The frontend turns these into user-facing `CompileError`s with the kernel's
source line; inside the IR they carry the operation's location when known.
"""


class IRError(Exception):
    """Base class of IR errors."""


class TypeRuleError(IRError):
    """An op's operands, attributes or results break its type rule."""


class VerifyError(IRError):
    """The verifier found a malformed module; the message names the op and why."""


class ParseError(IRError):
    """IR text that does not parse; the message names the line and column."""
