"""The one exception the runtime raises: `LaunchError`.

Every way a GPU launch can fail before or while the driver runs it -- no
driver, a CPU array passed to a GPU launch, a grid too large, a binary for
another architecture, a `CUresult` error -- becomes a `LaunchError` whose
message names the kernel (when known), what went wrong and what to change:

    tessera.runtime.LaunchError: kernel 'add': argument 0 (x_ptr) is a CPU
    tensor but the launch runs on the GPU; move it with .cuda(), or pass numpy
    arrays to run on the CPU interpreter

Driver errors keep the driver's own name (`CUDA_ERROR_ILLEGAL_ADDRESS`) in
`driver_error` so callers can test for them.
"""

from __future__ import annotations


class LaunchError(RuntimeError):
    """A kernel could not be loaded or launched; the message says why and what to do."""

    def __init__(self, message: str, *, kernel: str | None = None, driver_error: str | None = None):
        self.message = message
        self.kernel = kernel
        self.driver_error = driver_error
        super().__init__(self._format())

    def _format(self) -> str:
        return f"kernel '{self.kernel}': {self.message}" if self.kernel else self.message

    def with_kernel(self, kernel: str | None) -> "LaunchError":
        """The same error, naming `kernel` (added by the launcher on the way out)."""
        if self.kernel is None and kernel:
            self.kernel = kernel
            self.args = (self._format(),)
        return self

    def __str__(self) -> str:
        return self._format()
