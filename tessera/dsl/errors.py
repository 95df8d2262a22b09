"""User-facing compile errors.

Every mistake in a kernel is reported as a `CompileError` (or one of its
subclasses) that names the kernel, the file, line and column, shows the
offending source line with a caret, and says what to change:

    tessera.CompileError: kernel 'add' at vec.py:12:8:
        y = tessera.lod(y_ptr + offs)
            ^
    unknown name 'tessera.lod'; did you mean 'load'?

The frontend raises these with a location; the kernel object fills in the
kernel name. Nothing inside the compiler should escape as a raw traceback.
"""

from __future__ import annotations

import linecache


class CompileError(Exception):
    """A kernel could not be compiled; the message says where and what to do."""

    def __init__(self, message: str, *, kernel: str | None = None, file: str | None = None,
                 line: int | None = None, column: int | None = None, source_line: str | None = None):
        self.message = message
        self.kernel = kernel
        self.file = file
        self.line = line
        self.column = column
        self.source_line = source_line
        super().__init__(self._format())

    def _format(self) -> str:
        head = f"kernel '{self.kernel}'" if self.kernel else "kernel"
        if self.file is not None and self.line is not None:
            head += f" at {self.file}:{self.line}:{(self.column or 0) + 1}"
        text = head + ":\n"
        src = self.source_line
        if src is None and self.file is not None and self.line is not None:
            src = linecache.getline(self.file, self.line).rstrip("\n")
        if src:
            stripped = src.lstrip()
            indent = len(src) - len(stripped)
            text += f"    {stripped}\n"
            if self.column is not None:
                text += "    " + " " * max(self.column - indent, 0) + "^\n"
        return text + self.message

    def with_kernel(self, kernel: str) -> "CompileError":
        """The same error, naming `kernel` (set by the kernel object on the way out)."""
        if self.kernel is None:
            self.kernel = kernel
            self.args = (self._format(),)
        return self

    def __str__(self) -> str:
        return self._format()


class UnsupportedSyntaxError(CompileError):
    """Python syntax that kernels cannot use (classes, try, lambda, ...)."""


class UnknownNameError(CompileError):
    """A name that is neither a local, a kernel argument, a global nor a tessera builtin."""


class ConstexprError(CompileError):
    """A value that must be known at compile time is not (a shape, a static_range bound, ...)."""


class TypeMismatchError(CompileError):
    """Operand types or shapes that do not fit together."""


class LoopCarriedTypeError(TypeMismatchError):
    """A variable changes type across a loop iteration or between if/else branches."""


class KernelArgumentError(CompileError):
    """A launch with the wrong number or kinds of arguments."""


class StaticAssertionError(CompileError):
    """`static_assert` failed at compile time."""
