"""The exceptions the NVPTX backend raises: the LLVM core's, plus `PtxasError`.

* `CodegenError`, `BackendError`: see `tessera.backends.llvm.errors`.
* `PtxasError`: ptxas rejected the PTX or is missing/too old; the message
  carries ptxas's own stderr.
"""

from __future__ import annotations

from ..llvm.errors import BackendError, CodegenError

__all__ = ["BackendError", "CodegenError", "PtxasError"]


class PtxasError(BackendError):
    """ptxas failed (or cannot be found / is too old); `stderr` is what it printed."""

    def __init__(self, message: str, stderr: str = ""):
        self.stderr = stderr
        super().__init__(f"{message}\n{stderr.rstrip()}" if stderr.strip() else message)
