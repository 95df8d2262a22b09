"""One compiled kernel, ready to launch: `Launcher(binary, param_types)(grid, args)`.

    launcher = Launcher(compiled, [a.type for a in thread_fn.args], names=[...])   # once per specialization
    launcher((blocks,), [x, y, out, n])             # torch CUDA tensors, CAI/DLPack arrays, ints, floats
    launcher((blocks,), [x, y, out, n], stream=s)   # an int handle, a torch.cuda.Stream, ...

The module is loaded on the first launch on each device and kept: the cubin
when it runs there, else the PTX, which the driver compiles for GPUs newer
than the target (an sm_80 kernel on an H100). A launch then does only:
device addresses of the pointer arguments -> one `pack_into` into the
prepared buffer -> `cuLaunchKernel`. `prepared(ordinal)` hands out that last
part alone, `launch(gx, gy, gz, values, stream)` for values already
converted, which the warm path of `tessera/dsl/fast_launch.py` calls.

Which device: the one the tensor arguments live on (they must agree); with
no tensor that says, torch's current device, else the current context's.
Which stream: `stream=` when given; otherwise torch's current stream of that
device when any argument is a torch tensor (so `torch.cuda.graph` captures
the launch and it orders with torch's own kernels), else the legacy default
stream 0.

Kernels the compiler gave hidden tensor-map parameters (TMA loads and
stores on sm_90+) take `tensor_maps=`, their recipes: a launch passes only
the kernel's own arguments, and the maps are built from them
(`tensor_map.KernelTensorMaps`) and written by value into the prepared
buffer, only when a map's tensor, sizes or strides changed since the last
launch (a warm launch with the same tensors encodes and copies nothing).

A kernel compiled with a cluster shape (`tessera.cluster_dims`) launches
through `cluster_launch.py` (cuLaunchKernelEx with the cluster dims), which
also refuses a grid that is not a whole number of clusters.

An empty grid (a 0 in any dimension) launches nothing, as on the
interpreter. A launch holds a lock while it packs and launches, so threads
sharing a launcher cannot interleave their arguments.
"""

from __future__ import annotations

import importlib
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tessera.ir.tensor_map import TensorMapRecipe
from tessera.ir.types import PointerType, ScalarType, Type

from . import dlpack
from .errors import LaunchError
from .limits import as_dim3
from .packing import ArgumentPacker, pointer_and_device
from .tensor_map import KernelTensorMaps

BACKENDS = {"cuda": "tessera.runtime.cuda", "hip": "tessera.runtime.hip"}
PreparedLaunch = Callable[[int, int, int, Sequence[Any], int], None]


@dataclass(frozen=True)
class KernelBinary:
    """What the runtime needs of a compiled kernel (duck-typed from `CompiledKernel` by `of`)."""

    name: str
    target: str | None          # sm_90a, gfx942, ...: checked against the device before loading
    image: bytes | None         # cubin / AMD code object
    ptx: str | None = None      # NVIDIA: JIT-compiled by the driver when the cubin is missing or does not fit
    num_threads: int = 128      # threads per block the kernel was lowered for
    shared_bytes: int = 0       # dynamic shared memory per block
    cluster_dims: tuple[int, int, int] | None = None    # launched in clusters (`cluster_launch.py`)
    programs_per_block: int = 1     # programs along grid axis 0 one block runs (AMD's wave-group ping-pong: 2)

    @classmethod
    def of(cls, compiled: Any) -> "KernelBinary":
        if isinstance(compiled, KernelBinary):
            return compiled
        metadata = getattr(compiled, "metadata", {}) or {}
        stages = getattr(compiled, "stages", {}) or {}
        image = getattr(compiled, "cubin", None) or getattr(compiled, "code_object", None)
        threads = metadata.get("num_threads")
        if not threads:
            raise LaunchError(f"compiled kernel '{compiled.name}' does not say how many threads per block it "
                              f"was lowered for (metadata['num_threads'])")
        return cls(compiled.name, getattr(compiled, "target", None), image, stages.get("ptx"), int(threads),
                   int(metadata.get("shared_bytes") or 0), cluster_shape(metadata),
                   int(metadata.get("programs_per_block") or 1))


def _blocks_of_programs(launch: PreparedLaunch, per_block: int) -> PreparedLaunch:
    """`launch` taking a grid of programs where a block runs `per_block` of them along axis 0 (AMD's wave-group
    ping-pong: 2): grid x becomes ceil(x / per_block) blocks."""
    def programs(gx: int, gy: int, gz: int, values: Sequence[Any], stream: int) -> None:
        launch(-(-gx // per_block), gy, gz, values, stream)
    return programs


class Launcher:
    """A kernel specialization bound to a backend; call it with a grid and the runtime arguments."""

    def __init__(self, binary: Any, param_types: Sequence[PointerType | ScalarType | Type], backend: Any = "cuda",
                 *, names: Sequence[str] | None = None, tensor_maps: Sequence[TensorMapRecipe] = ()):
        self.binary = KernelBinary.of(binary)
        self.packer = ArgumentPacker(param_types, names)
        self.tensor_maps = KernelTensorMaps(tensor_maps, [s.name for s in self.packer.slots]) if tensor_maps \
            else None
        self.block = (self.binary.num_threads, 1, 1)
        if isinstance(backend, str):
            if backend not in BACKENDS:
                raise LaunchError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
            backend = importlib.import_module(BACKENDS[backend])
        self._backend = backend
        self._pointers = tuple(s.index for s in self.packer.slots if s.is_pointer)
        self._functions: dict[int, Any] = {}       # device ordinal -> loaded function
        self._prepared: dict[int, PreparedLaunch] = {}
        self._resident: dict[int, int] = {}        # device ordinal -> resident_programs (asked once)
        self._pack_with_maps: Callable[[Sequence[Any]], None] | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<Launcher {self.binary.name} ({self.binary.target})>"

    def __call__(self, grid: Any, args: Sequence[Any], stream: Any = None) -> None:
        try:
            grid = as_dim3(grid, "grid")
            if 0 in grid:
                return
            values, ordinal, torch_args, exported = self._arguments(args)
            launch = self._prepared.get(ordinal) or self.prepared(ordinal)
            handle = stream_handle(stream) if stream is not None else (
                torch_current_stream(ordinal) if torch_args else 0)
            for i in exported:
                values[i] = self._export(i, values[i], handle)
            launch(*grid, values, handle)
        except LaunchError as exc:
            raise exc.with_kernel(self.binary.name) from None

    def prepared(self, ordinal: int) -> PreparedLaunch:
        """`launch(gx, gy, gz, values, stream)` on device `ordinal` (loading the module there if need be):
        `values` are the runtime arguments already converted (device addresses for pointers), `stream` a raw
        handle and the grid non-empty. It builds the tensor maps, packs and calls the driver; nothing else."""
        launch = self._prepared.get(ordinal)
        if launch is not None:
            return launch
        function = self._functions.get(ordinal) or self._load(ordinal)
        device, block, shared, packer = function.device, self.block, self.binary.shared_bytes, self.packer
        pack = packer.pack if self.tensor_maps is None else self._map_packing()
        prepare = getattr(device, "prepare_launch", None)
        if self.binary.cluster_dims is not None:       # cuLaunchKernelEx with the cluster dims
            if prepare is None:
                raise LaunchError(f"the kernel runs in clusters of {self.binary.cluster_dims} programs, which only "
                                  "NVIDIA GPUs (sm_90+) have")
            from .cluster_launch import prepare_cluster_launch
            launch = prepare_cluster_launch(device, function, block, shared, packer, self.binary.cluster_dims,
                                            pack=pack, lock=self._lock)
        elif prepare is not None:
            launch = prepare(function, block, shared, packer, pack=pack, lock=self._lock)
        else:       # a backend without prepared launches (HIP): the general call
            lock = self._lock

            def launch(gx: int, gy: int, gz: int, values: Sequence[Any], stream: int) -> None:
                with lock:
                    pack(values)
                    device.launch(function, (gx, gy, gz), block, shared, packer, stream)
        if self.binary.programs_per_block > 1:     # here, so that the warm entries calling it directly divide too
            launch = _blocks_of_programs(launch, self.binary.programs_per_block)
        self._prepared[ordinal] = launch
        return launch

    def _map_packing(self) -> Callable[[Sequence[Any]], None]:
        """`pack(values)` for a kernel with tensor maps: its own arguments packed, and each map written into the
        buffer only when it changes (`KernelTensorMaps.packing`); else the maps completed and packed whole.
        One per launcher, not per device: the devices share the buffer, so what it holds is tracked once."""
        with self._lock:             # two threads preparing two devices at once must get the same one
            if self._pack_with_maps is None:
                packer, maps = self.packer, self.tensor_maps
                in_place = maps.packing(packer)
                if in_place is None:
                    complete = maps.complete
                    in_place = lambda values: packer.pack(complete(values))    # noqa: E731
                self._pack_with_maps = in_place
            return self._pack_with_maps

    def resident_programs(self, ordinal: int | None = None) -> int:
        """How many programs of this kernel device `ordinal` (default: the current one) runs at once: its
        SMs (CUs) times the blocks one holds, given the kernel's registers, shared memory and block size.
        A persistent kernel whose programs wait for each other must launch no more than this, or a waiting
        program may occupy the SM the program it waits for needs. Loads the module if need be."""
        ordinal = self._backend.current_ordinal() if ordinal is None else ordinal
        known = self._resident.get(ordinal)
        if known is not None:
            return known
        try:
            function = self._functions.get(ordinal) or self._load(ordinal)
            device = function.device
            per_unit = device.blocks_per_multiprocessor(function, self.block[0], self.binary.shared_bytes)
        except LaunchError as exc:
            raise exc.with_kernel(self.binary.name) from None
        if per_unit < 1:
            raise LaunchError(f"not one block fits on an SM of {device.limits.name}: {self.block[0]} threads, "
                              f"{self.binary.shared_bytes} bytes of dynamic shared memory; use smaller tiles or "
                              f"fewer warps", kernel=self.binary.name)
        self._resident[ordinal] = per_unit * device.multiprocessors
        return self._resident[ordinal]

    def _arguments(self, args: Sequence[Any]) -> tuple[list[Any], int, bool, list[int]]:
        """Pointer arguments -> addresses; the device they live on; whether any is a torch tensor; and which
        are GPU `__dlpack__` objects, left for `_export` once the launch's stream is known."""
        slots = [s for s in self.packer.slots if not s.is_tensor_map]     # the maps are built, not passed
        if len(args) != len(slots):
            names = ", ".join(s.name or str(s.type) for s in slots)
            raise LaunchError(f"the kernel takes {len(slots)} runtime arguments ({names}), got {len(args)}")
        values = list(args)
        torch = sys.modules.get("torch")
        ordinal, owner, torch_args, exported = None, None, False, []
        for i in self._pointers:
            value = values[i]
            if value is None or type(value) is int:
                continue
            try:
                if dlpack.is_gpu_dlpack(value):
                    address, where = value, dlpack.gpu_device(value)     # the address comes with the stream
                    exported.append(i)
                else:
                    address, where = pointer_and_device(value)
                if where is None:
                    where = self._backend.pointer_device(address)
            except LaunchError as exc:
                raise LaunchError(f"{slots[i].describe()}: {exc.message}") from None
            if where is not None:
                if ordinal is None:
                    ordinal, owner = where, slots[i]
                elif where != ordinal:
                    raise LaunchError(f"{slots[i].describe()} is on GPU {where} but {owner.describe()} is on GPU "
                                      f"{ordinal}; put all tensors of a launch on one device (.to('cuda:{ordinal}'))")
            torch_args = torch_args or (torch is not None and isinstance(value, torch.Tensor))
            values[i] = address
        if ordinal is None:
            ordinal = self._backend.current_ordinal()
        return values, ordinal, torch_args, exported

    def _export(self, i: int, obj: Any, stream: int) -> int:
        """The address of GPU `__dlpack__` argument `i`, exported for the launch's `stream` (the producer orders
        its pending work before the kernel, as the protocol asks)."""
        slot = [s for s in self.packer.slots if not s.is_tensor_map][i]
        try:
            device_type = int(obj.__dlpack_device__()[0])
            return dlpack.read(obj, dlpack.stream_argument(stream, device_type)).address
        except LaunchError as exc:
            raise LaunchError(f"{slot.describe()}: {exc.message}") from None

    def _load(self, ordinal: int):
        with self._lock:
            function = self._functions.get(ordinal)
            if function is None:
                device = self._backend.get_device(ordinal)
                module = self._load_module(device)
                function = device.get_function(module, self.binary.name)
                self._functions[ordinal] = function
            return function

    def _load_module(self, device):
        """The cubin when it runs on `device`, else the PTX (the driver compiles it for newer GPUs, as
        a fatbin's PTX would be); a LaunchError naming the target to compile for when neither fits."""
        binary = self.binary
        if getattr(device, "backend", None) == "hip":
            device.check_target(binary.target)
            return device.load_module(code_object=binary.image)
        if binary.image is not None:
            try:
                device.check_target(binary.target, cubin=True)
                return device.load_module(cubin=binary.image)
            except LaunchError:
                if not binary.ptx:
                    raise
        device.check_target(binary.target, cubin=False)
        return device.load_module(ptx=binary.ptx)


def cluster_shape(metadata: dict) -> tuple[int, int, int] | None:
    """The cluster dims a compiled kernel's metadata gives (`cluster_dims`), or None for a plain launch."""
    dims = tuple(int(d) for d in metadata.get("cluster_dims") or ())
    dims = dims + (1,) * (3 - len(dims))
    return None if dims == (1, 1, 1) else dims


def stream_handle(stream: Any) -> int:
    """An explicit stream -> its raw handle: an int, a torch/CuPy stream, a CUstream, or a `__cuda_stream__` object."""
    if isinstance(stream, int):
        return stream
    handle = getattr(stream, "cuda_stream", None)      # torch.cuda.Stream / ExternalStream
    if handle is None:
        handle = getattr(stream, "ptr", None)          # cupy.cuda.Stream
    if handle is None and hasattr(stream, "__cuda_stream__"):
        handle = stream.__cuda_stream__()[1]            # cuda.core protocol: (version, handle)
    if handle is None:
        try:
            handle = int(stream)                         # cuda.bindings CUstream
        except (TypeError, ValueError):
            raise LaunchError(f"stream= takes an int handle or a stream object (torch.cuda.Stream, CuPy, "
                              f"cuda.core), got {type(stream).__name__}") from None
    return int(handle)


def torch_current_stream(ordinal: int) -> int:
    """torch's current stream on device `ordinal` (the capture stream inside `torch.cuda.graph`)."""
    torch = sys.modules["torch"]
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)   # what Triton uses: no Stream object
    if raw is not None:
        return raw(ordinal)
    return torch.cuda.current_stream(ordinal).cuda_stream
