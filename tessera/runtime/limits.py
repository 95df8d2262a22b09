"""What a launch may ask of a GPU, checked before the driver sees it.

The driver answers a bad launch with a bare `CUDA_ERROR_INVALID_VALUE`;
`validate_launch` says instead which number is too large and what to change.
Each backend fills a `DeviceLimits` from its device's attributes; the
defaults are CUDA's for every GPU since compute capability 3.0.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import LaunchError

DEFAULT_SHARED_BYTES = 48 * 1024   # dynamic shared memory a CUDA kernel gets without opting in


@dataclass(frozen=True)
class DeviceLimits:
    name: str = "GPU"
    max_grid: tuple[int, int, int] = (2**31 - 1, 65535, 65535)
    max_block: tuple[int, int, int] = (1024, 1024, 64)
    max_threads_per_block: int = 1024
    max_shared_bytes: int = DEFAULT_SHARED_BYTES   # per block, with the opt-in where the GPU has one


def as_dim3(dims, what: str) -> tuple[int, int, int]:
    """An int or 1-3 ints -> (x, y, z), padding with 1s."""
    if type(dims) is tuple and len(dims) == 1 and type(dims[0]) is int and dims[0] >= 0:
        return (dims[0], 1, 1)     # the common launch, without the general checks below
    if isinstance(dims, int) and not isinstance(dims, bool):
        dims = (dims,)
    if not (isinstance(dims, (tuple, list)) and 1 <= len(dims) <= 3
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims)):
        raise LaunchError(f"{what} must be 1 to 3 non-negative ints, got {dims!r}")
    return (*dims, *(1,) * (3 - len(dims)))


def validate_launch(grid: tuple[int, int, int], block: tuple[int, int, int], shared_bytes: int,
                    limits: DeviceLimits, kernel_max_threads: int | None = None) -> None:
    """Raise a LaunchError naming the first limit this launch exceeds."""
    for axis, (n, most) in enumerate(zip(grid, limits.max_grid)):
        if n > most:
            hint = ("launch fewer programs, each looping over several tiles" if axis == 0 else
                    "put the largest grid dimension first: axis 0 allows up to "
                    f"{limits.max_grid[0]} programs")
            raise LaunchError(f"grid dimension {axis} is {n}, above the limit of {most} on {limits.name}; {hint}")
    threads = block[0] * block[1] * block[2]
    if threads > limits.max_threads_per_block or any(b > m for b, m in zip(block, limits.max_block)):
        raise LaunchError(f"a block of {block[0]}x{block[1]}x{block[2]} threads exceeds {limits.name}'s limit of "
                          f"{limits.max_threads_per_block} threads per block; compile with fewer warps (num_warps)")
    if kernel_max_threads is not None and threads > kernel_max_threads:
        raise LaunchError(f"the kernel can run at most {kernel_max_threads} threads per block (its launch bound or "
                          f"register use), but the launch asks for {threads}; compile with fewer warps")
    if shared_bytes > limits.max_shared_bytes:
        raise LaunchError(f"the kernel needs {shared_bytes} bytes of shared memory per block but {limits.name} "
                          f"allows at most {limits.max_shared_bytes}; use smaller tiles (BLOCK sizes) or fewer "
                          f"pipeline stages")
