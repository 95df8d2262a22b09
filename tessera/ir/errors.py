"""Exceptions raised by the IR layer, and the form every layer's errors give their location in.

The frontend turns these into user-facing `CompileError`s with the kernel's
source line; inside the IR they carry the operation's location when known.
"""


def located(message: str, loc, where: list[str]) -> str:
    """`<loc>: in <where, ...>: <message>` (the parts that are missing left out), e.g.
    "k.py:7:5: in kernel 'add', op 'load': ..." -- the interpreter's, the passes' and the backends' errors."""
    prefix = f"{loc}: " if loc is not None else ""
    context = f"in {', '.join(where)}: " if where else ""
    return f"{prefix}{context}{message}"


class IRError(Exception):
    """Base class of IR errors."""


class TypeRuleError(IRError):
    """An op's operands, attributes or results break its type rule."""


class VerifyError(IRError):
    """The verifier found a malformed module; the message names the op and why."""


class ParseError(IRError):
    """IR text that does not parse; the message names the line and column."""
