"""Library kernels written in Tessera, exposed as torch custom ops (`torch.ops.tessera.*`). They may import
only the public API (`import tessera`), like any user's code.
"""

from . import quant
from .gemm import gemm
from .quant_gemm import quant_gemm

__all__ = ["gemm", "quant", "quant_gemm"]
