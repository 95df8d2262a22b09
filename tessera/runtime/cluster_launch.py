"""Launching a kernel compiled with a cluster shape (`tessera.cluster_dims`): cuLaunchKernelEx with
CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION.

A kernel whose PTX says `.reqnctapercluster X, Y, Z` must be launched with
those cluster dims, on a GPU with clusters (compute capability 9.0+), with
a grid that is a whole number of clusters along each axis; anything else
is refused here with a LaunchError saying what to change, before the driver
would fail with a bare CUDA_ERROR_INVALID_CLUSTER_SIZE. The `Launcher`
takes this path only for such kernels (`KernelBinary.cluster_dims`), so the
plain launch path stays as it is: per launch the grid check, the pack and
one cuLaunchKernelEx with a config built once per grid shape.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from .cuda import _NOT_OUR_CONTEXT as NOT_OUR_CONTEXT, driver_error
from .errors import LaunchError
from .limits import validate_launch

CLUSTER_CAPABILITY = (9, 0)


def check_cluster_grid(grid: tuple[int, int, int], dims: tuple[int, int, int]) -> None:
    """The grid must be a multiple of the cluster dims along each axis."""
    if any(g % d for g, d in zip(grid, dims)):
        raise LaunchError(f"the grid {grid} is not a whole number of clusters of {dims} programs (the kernel's "
                          f"tessera.cluster_dims); launch a grid that is a multiple of {dims} along each axis")


def check_device(device: Any, dims: tuple[int, int, int]) -> None:
    """The GPU must have thread-block clusters (sm_90+)."""
    if tuple(device.capability) < CLUSTER_CAPABILITY:
        raise LaunchError(f"the kernel runs in clusters of {dims} programs (tessera.cluster_dims), but "
                          f"{device.limits.name} has no thread-block clusters (they need compute capability 9.0+); "
                          "compile a config without clusters for this GPU")


def prepare_cluster_launch(device: Any, function: Any, block: tuple[int, int, int], shared_bytes: int, packer: Any,
                           dims: tuple[int, int, int], *, pack: Callable[[Sequence[Any]], None] | None = None,
                           lock: Any = None) -> Callable[[int, int, int, Sequence[Any], int], None]:
    """`launch(gx, gy, gz, values, stream)` as `CudaDevice.prepare_launch`'s, through cuLaunchKernelEx with the
    cluster dimension attribute (block and shared memory checked once here; the grid per launch)."""
    check_device(device, dims)
    d = device._driver
    if (block, shared_bytes) not in function.validated:
        validate_launch((1, 1, 1), block, shared_bytes + function.static_shared_bytes, device.limits,
                        function.max_threads)
        function.validated.add((block, shared_bytes))
    if shared_bytes > function.dynamic_shared_limit:
        device._opt_in_shared_bytes(function, shared_bytes)
    attribute = d.CUlaunchAttribute()
    attribute.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attribute.value.clusterDim.x, attribute.value.clusterDim.y, attribute.value.clusterDim.z = dims
    configs: dict[tuple[int, int, int, int], Any] = {}
    handle, params, pack = function.handle, packer.kernel_params, pack or (lambda values: None)

    def config_for(gx: int, gy: int, gz: int, stream: int) -> Any:
        key = (gx, gy, gz, stream)
        config = configs.get(key)
        if config is None:
            check_cluster_grid((gx, gy, gz), dims)
            validate_launch((gx, gy, gz), block, shared_bytes + function.static_shared_bytes, device.limits)
            config = d.CUlaunchConfig()
            config.gridDimX, config.gridDimY, config.gridDimZ = gx, gy, gz
            config.blockDimX, config.blockDimY, config.blockDimZ = block
            config.sharedMemBytes = shared_bytes
            config.hStream = d.CUstream(stream)
            config.attrs = [attribute]
            config.numAttrs = 1
            configs[key] = config
        return config

    optimistic = device.only_device

    def launch(gx: int, gy: int, gz: int, values: Sequence[Any], stream: int) -> None:
        config = config_for(gx, gy, gz, stream)
        if lock is not None:
            lock.acquire()
        try:
            pack(values)
            err = None
            if optimistic:          # as the plain path: launch first, make our context current only if refused
                (err,) = d.cuLaunchKernelEx(config, handle, params, 0)
            if err is None or int(err) in NOT_OUR_CONTEXT:
                pushed = device._enter()
                try:
                    (err,) = d.cuLaunchKernelEx(config, handle, params, 0)
                finally:
                    device._exit(pushed)
        finally:
            if lock is not None:
                lock.release()
        if int(err) != 0:
            raise driver_error(err, f"launching kernel '{function.name}' in clusters of {dims} (cuLaunchKernelEx)")
    return launch
