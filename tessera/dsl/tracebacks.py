"""Errors in a user's kernel shown the way Python shows a SyntaxError: the user's frames and the message.

A CompileError or InterpreterError already says where in the kernel it is (file:line:col, the source
line, a caret) and what to change. The 60-90 frames of tracer and compiler below the user's call only
hide that. `install()` (called on `import tessera`) wraps `sys.excepthook` so that, for those errors
when they end the program, the traceback stops at the first frame inside the tessera package, with one
line saying how to see the rest: `TESSERA_TRACEBACK=1` prints the full traceback. An exception the
program catches keeps its whole traceback; a hook someone installed before tessera is left alone.
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

from ..backends.interp import InterpreterError
from .errors import CompileError

PACKAGE = str(Path(__file__).resolve().parents[1]) + os.sep      # .../tessera/
USER_FACING = (CompileError, InterpreterError)
FULL_TRACEBACK_ENV = "TESSERA_TRACEBACK"


def users_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback up to (not including) its first frame inside the tessera package."""
    kept = []
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith(PACKAGE):
        kept.append(tb)
        tb = tb.tb_next
    chain = None
    for entry in reversed(kept):
        chain = types.TracebackType(chain, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return chain


def _hook(previous):
    def excepthook(kind, value, tb):
        if isinstance(value, USER_FACING) and os.environ.get(FULL_TRACEBACK_ENV, "0") != "1":
            trimmed = users_frames(tb)
            previous(kind, value.with_traceback(trimmed), trimmed)   # the default hook reads __traceback__
            print(f"(tessera's own frames are hidden; {FULL_TRACEBACK_ENV}=1 shows them)", file=sys.stderr)
        else:
            previous(kind, value, tb)
    excepthook.tessera = True
    return excepthook


def install() -> None:
    """Wrap the interpreter's default excepthook (never one a program or another library installed)."""
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _hook(sys.__excepthook__)
