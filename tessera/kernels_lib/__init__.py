"""Library kernels written in Tessera, exposed as torch custom ops (`torch.ops.tessera.*`)."""

from .gemm import gemm

__all__ = ["gemm"]
