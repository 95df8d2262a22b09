"""`StubDriver`: cuda-python's driver module as one GPU would answer it, without a GPU.

    with stubbed_driver() as driver:          # tessera.runtime.cuda now talks to the stub
        kernel[grid](x, y, out, n)            # CUDA-array-interface objects stand in for tensors
        driver.counts["cuLaunchKernel"]       # how many times each driver function was called

Tests use it to check what the runtime asks of the driver (which context a
launch runs in, how many driver calls a warm launch makes), and
`bench/launch_overhead.py --stub-driver` to measure the host's launch path on
a machine without a GPU. It answers only the calls `runtime/cuda.py` makes,
like an sm_80 GPU, or with `hopper=True` an sm_90a one (`attributes` can be
changed; the occupancy query answers as the occupancy calculator does for an
A100 SM). `cuLaunchKernelEx` (cluster launches) records its launch
attributes. It counts every call it answers (`counts`), the tensor-map encoder
`cuTensorMapEncodeTiled` included (its maps hold what the encoding depends
on), and it models the one driver rule the launch path relies on:
`cuLaunchKernel` fails with CUDA_ERROR_INVALID_CONTEXT when no context is
current and with CUDA_ERROR_INVALID_HANDLE when another context than the
function's is.
Handles, enums and results are cuda-python's own types, so what the runtime
converts is what it converts on a real driver.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any, Iterator

PRIMARY_CONTEXT = 0xC0


class StubDriver:
    """Answers the `cuda.bindings.driver` calls `CudaDevice` makes; see the module docstring."""

    def __init__(self, *, record: bool = True, device_count: int = 1, hopper: bool = False):
        """`hopper`: answer as an H100 SXM (sm_90a: compute capability 9.0, 132 SMs, 227 KiB of opt-in shared
        memory per block), so kernels compile with TMA and wgmma and launches build tensor maps."""
        from cuda.bindings import driver

        self.real = driver
        self.CUresult = driver.CUresult
        self.CUdevice_attribute = driver.CUdevice_attribute
        self.CUfunction_attribute = driver.CUfunction_attribute
        self.CUpointer_attribute = driver.CUpointer_attribute
        self.CUlaunchAttribute, self.CUlaunchAttributeID = driver.CUlaunchAttribute, driver.CUlaunchAttributeID
        self.CUlaunchConfig, self.CUstream = driver.CUlaunchConfig, driver.CUstream
        for name in ("CUtensorMap", "CUtensorMapDataType", "CUtensorMapInterleave", "CUtensorMapSwizzle",
                     "CUtensorMapL2promotion", "CUtensorMapFloatOOBfill", "cuuint32_t", "cuuint64_t"):
            setattr(self, name, getattr(driver, name))      # the tensor-map encoder's argument types
        self.ok = driver.CUresult.CUDA_SUCCESS
        self.record = record            # count and keep every call in `counts` and `calls` (tests); benchmarks
                                        # turn it off, so a launch costs the stub as little as it can
        self.calls: list[tuple] = []
        self.counts: Counter[str] = Counter()
        self.current = 0                # the thread's current context
        self.stack: list[int] = []
        self.device_count = device_count
        self.launch_result = self.ok
        self.function_max_threads = 1024    # what cuFuncGetAttribute says of every kernel
        A = driver.CUdevice_attribute
        self.attributes = {
            A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: 8, A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: 0,
            A.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: 2**31 - 1, A.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: 65535,
            A.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: 65535, A.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: 1024,
            A.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: 1024, A.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: 64,
            A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: 1024,
            A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 163 * 1024,
            A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: 108,
            A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: 164 * 1024,
            A.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: 65536,
            A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: 2048,
            A.CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: 32,
        }
        if hopper:
            self.attributes.update({
                A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: 9, A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: 132,
                A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 227 * 1024,
                A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: 228 * 1024})
        self.function_registers = 20        # what cuFuncGetAttribute says of every kernel (occupancy uses it)
        self.function_static_shared = 0
        self.dynamic_shared_limits: dict[Any, int] = {}   # function -> its opted-in dynamic shared memory

    def _called(self, name: str, *args: Any) -> None:
        self.counts[name] += 1
        if self.record:
            self.calls.append((name, *args))

    def cuDeviceGetCount(self):
        self._called("cuDeviceGetCount")
        return self.ok, self.device_count

    def cuDeviceGet(self, ordinal):
        self._called("cuDeviceGet")
        return self.ok, self.real.CUdevice(ordinal)

    def cuDeviceGetName(self, length, device):
        self._called("cuDeviceGetName")
        major = self.attributes[self.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR]
        return self.ok, b"Stub H100\0\0\0" if major == 9 else b"Stub A100\0\0\0"

    def cuDeviceGetAttribute(self, attribute, device):
        self._called("cuDeviceGetAttribute")
        return self.ok, self.attributes[attribute]

    def cuDevicePrimaryCtxRetain(self, device):
        self._called("cuDevicePrimaryCtxRetain")
        return self.ok, self.real.CUcontext(PRIMARY_CONTEXT + int(device))

    def cuCtxGetDevice(self):
        self._called("cuCtxGetDevice")
        return self.ok, self.real.CUdevice(0)

    def cuCtxGetCurrent(self):
        self._called("cuCtxGetCurrent")
        return self.ok, self.real.CUcontext(self.current)

    def cuCtxSetCurrent(self, context):
        self._called("cuCtxSetCurrent", int(context))
        self.current = int(context)
        return (self.ok,)

    def cuCtxPushCurrent(self, context):
        self._called("cuCtxPushCurrent", int(context))
        self.stack.append(self.current)
        self.current = int(context)
        return (self.ok,)

    def cuCtxPopCurrent(self):
        self._called("cuCtxPopCurrent")
        popped, self.current = self.current, self.stack.pop()
        return self.ok, self.real.CUcontext(popped)

    def cuModuleLoadData(self, image):
        self._called("cuModuleLoadData", bytes(image), self.current)
        return self.ok, ("module", self.current, bytes(image))

    def cuModuleGetFunction(self, module, name):
        self._called("cuModuleGetFunction")
        return self.ok, ("function", name.decode(), module)

    def cuFuncGetAttribute(self, attribute, function):
        self._called("cuFuncGetAttribute")
        F = self.CUfunction_attribute
        return self.ok, {F.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: self.function_max_threads,
                         F.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: self.function_static_shared,
                         F.CU_FUNC_ATTRIBUTE_NUM_REGS: self.function_registers}[attribute]

    def cuFuncSetAttribute(self, function, attribute, value):
        self._called("cuFuncSetAttribute", attribute.name, value)
        if attribute == self.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
            self.dynamic_shared_limits[function] = value
        return (self.ok,)

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, function, block_threads, dynamic_shared):
        """The occupancy calculator's answer for an sm_80 SM: the fewest blocks that registers (allocated
        per warp in units of 256), shared memory (1 KiB reserved per block), threads and the block limit
        allow; 0 when the block cannot fit at all, or asks for more dynamic shared memory than the function
        was opted in to (48 KiB by default), as the driver answers."""
        self._called("cuOccupancyMaxActiveBlocksPerMultiprocessor", function, block_threads, dynamic_shared)
        A = self.CUdevice_attribute
        sm = {name: self.attributes[getattr(A, f"CU_DEVICE_ATTRIBUTE_{name}_PER_MULTIPROCESSOR")]
              for name in ("MAX_SHARED_MEMORY", "MAX_REGISTERS", "MAX_THREADS", "MAX_BLOCKS")}
        if dynamic_shared > self.dynamic_shared_limits.get(function, 48 * 1024) or block_threads > 1024:
            return self.ok, 0
        warps = -(-block_threads // 32)
        registers_per_warp = -(-self.function_registers * 32 // 256) * 256
        by_registers = (sm["MAX_REGISTERS"] // registers_per_warp) // warps if registers_per_warp else sm["MAX_BLOCKS"]
        by_shared = sm["MAX_SHARED_MEMORY"] // (self.function_static_shared + dynamic_shared + 1024)
        by_threads = sm["MAX_THREADS"] // (warps * 32)
        return self.ok, max(0, min(sm["MAX_BLOCKS"], by_registers, by_shared, by_threads))

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        current = self.current
        if self.record:
            self.counts["cuLaunchKernel"] += 1
            self.calls.append(("cuLaunchKernel", f, (gx, gy, gz), (bx, by, bz), shared, stream, params, extra,
                               current))
        if current == f[2][1]:             # the context the function's module was loaded in
            return (self.launch_result,)
        if current == 0:
            return (self.CUresult.CUDA_ERROR_INVALID_CONTEXT,)
        return (self.CUresult.CUDA_ERROR_INVALID_HANDLE,)

    def cuLaunchKernelEx(self, config, f, params, extra):
        """A launch with attributes: recorded as ("cuLaunchKernelEx", f, grid, block, shared, stream, params,
        {attribute name: value}, context); cluster dims as an (x, y, z) tuple. Like the driver, it refuses a grid
        that is not a whole number of clusters (CUDA_ERROR_INVALID_CLUSTER_SIZE), and context rules as above."""
        current = self.current
        grid = (int(config.gridDimX), int(config.gridDimY), int(config.gridDimZ))
        attributes = {}
        for attribute in list(config.attrs)[:int(config.numAttrs)]:
            if attribute.id == self.real.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
                cluster = attribute.value.clusterDim
                attributes["cluster_dims"] = (int(cluster.x), int(cluster.y), int(cluster.z))
            else:
                attributes[attribute.id.name] = attribute.value
        if self.record:
            self.counts["cuLaunchKernelEx"] += 1
            self.calls.append(("cuLaunchKernelEx", f, grid, (int(config.blockDimX), int(config.blockDimY),
                                                             int(config.blockDimZ)),
                               int(config.sharedMemBytes), int(config.hStream), params, attributes, current))
        dims = attributes.get("cluster_dims", (1, 1, 1))
        if any(g % c for g, c in zip(grid, dims)):
            return (self.CUresult.CUDA_ERROR_INVALID_CLUSTER_SIZE,)
        if current == f[2][1]:
            return (self.launch_result,)
        if current == 0:
            return (self.CUresult.CUDA_ERROR_INVALID_CONTEXT,)
        return (self.CUresult.CUDA_ERROR_INVALID_HANDLE,)

    def cuPointerGetAttribute(self, attribute, address):
        self._called("cuPointerGetAttribute", address)
        return self.ok, 0

    def cuCtxSynchronize(self):
        self._called("cuCtxSynchronize")
        return (self.ok,)

    def cuTensorMapEncodeTiled(self, data_type, rank, address, dims, strides, box, element_strides, interleave,
                               swizzle, l2_promotion, oob_fill):
        """A `CUtensorMap` whose 16 words hold what the driver's encoding depends on (address, dims, strides,
        box, data type and swizzle), so equal requests give equal bytes and different ones different bytes;
        like the driver, it refuses a rank outside 1..5 and an address not 16-byte aligned."""
        self._called("cuTensorMapEncodeTiled", int(address))
        rank, address = int(rank), int(address)
        if not 1 <= rank <= 5 or address % 16:
            return self.CUresult.CUDA_ERROR_INVALID_VALUE, None
        words = [address, int(data_type), int(swizzle), *(int(v) for v in (*dims, *strides, *box))][:16]
        tensor_map = self.real.CUtensorMap()
        tensor_map.opaque = words + [0] * (16 - len(words))
        return self.ok, tensor_map

    def launches(self) -> list[tuple]:
        """The recorded cuLaunchKernel (and cuLaunchKernelEx) calls that ran (in the function's own context)."""
        return [c for c in self.calls if c[0] in ("cuLaunchKernel", "cuLaunchKernelEx") and c[-1] == c[1][2][1]]


@contextlib.contextmanager
def stubbed_driver(driver: StubDriver | None = None) -> Iterator[StubDriver]:
    """Point `tessera.runtime.cuda` at a `StubDriver` (a fresh one by default) for the duration."""
    from . import cuda

    driver = driver or StubDriver()
    saved = cuda._driver, cuda.driver_available, cuda._devices
    cuda._driver, cuda.driver_available, cuda._devices = (lambda: driver), (lambda: True), {}
    try:
        yield driver
    finally:
        cuda._driver, cuda.driver_available, cuda._devices = saved
