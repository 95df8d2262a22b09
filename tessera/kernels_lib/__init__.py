"""Library kernels written in Tessera, exposed as torch custom ops (`torch.ops.tessera.*`). They may import
only the public API (`import tessera`), like any user's code.
"""

from .gemm import gemm

__all__ = ["gemm"]
