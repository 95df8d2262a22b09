"""Library kernels written in Tessera, exposed as torch custom ops (`torch.ops.tessera.*`). They may import
only the public API (`import tessera`), like any user's code.
"""

try:
    import torch  # noqa: F401
except ImportError:
    raise ImportError("tessera.kernels_lib needs PyTorch: pip install 'tessera[torch]' (or any torch >= 2.4); "
                      "the rest of tessera works without it") from None

from . import epilogues, moe, quant  # noqa: E402
from .attention import attention, attention_varlen  # noqa: E402
from .attention_decode import attention_decode  # noqa: E402
from .gemm import gemm  # noqa: E402
from .quant_gemm import quant_gemm  # noqa: E402

__all__ = ["attention", "attention_decode", "attention_varlen", "epilogues", "gemm", "moe", "quant", "quant_gemm"]
