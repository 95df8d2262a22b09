"""What a warm launch of the library GEMM asks of the driver on Hopper (sm_90a: TMA loads, TMA store of C).

The driver is `StubDriver(hopper=True)`, which counts every call, tensor-map
encodes included, and whose maps hold what the encoding depends on (their
first word is the tensor's address). A warm launch with the same tensors is
one `cuLaunchKernel` and nothing else: no map encoded, none copied into the
parameter buffer; a new output tensor costs one encode (its C map), and the
buffer always holds the maps of the launch's own tensors.
"""

from __future__ import annotations

import importlib
from collections import Counter

import pytest

from tessera.runtime.stub_driver import StubDriver, stubbed_driver

gemm = importlib.import_module("tessera.kernels_lib.gemm")    # the package exports the function `gemm`
SIZE = 64
FLAGS = dict(HAS_BIAS=False, SCALE_A="none", SCALE_B="none", ACTIVATION="none")


class Array:
    """A float16 GPU matrix as the CUDA array interface describes it, at a made-up address."""

    def __init__(self, address: int, shape: tuple[int, int] = (SIZE, SIZE)):
        self.address = address
        self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f2", "data": (address, False), "version": 3,
                                         "strides": None}


A, B, C, OTHER_C = (Array(0x7E0000000000 + i * 0x100000) for i in range(4))


KERNELS = (gemm.gemm_kernel.kernel, gemm.gemm_split_k.gemm_split_k_kernel_fast)


def forget_launches() -> None:
    """Drop the launchers and warm launches prepared on another (stub) driver."""
    for kernel in KERNELS:
        kernel.launchers.clear()
        kernel.fast_launches.clear()


@pytest.fixture
def hopper():
    gemm.gemm_kernel.pin(gemm.CONFIGS[3])       # no GPU to tune on
    forget_launches()
    try:
        with stubbed_driver(StubDriver(hopper=True)) as driver:
            yield driver
    finally:
        forget_launches()
        gemm.gemm_kernel.pin(None)


def kernel_launch(c):
    """`gemm_kernel`'s own launch (the op's tiled path): 14 arguments, a callable grid, autotuned (pinned)."""
    args = (A, B, c, c, c, c, SIZE, SIZE, SIZE, 1.0, SIZE, 1, SIZE, 1)
    return lambda: gemm.gemm_kernel[lambda meta: gemm._grid(SIZE, SIZE, meta, 132)](*args, **FLAGS)


def op_launch(c):
    """The op's launches at 64^3 (`launch_kernels`: the small-M split-K kernel)."""
    args = (A, B, c, c, c, c, SIZE, SIZE, SIZE, 1.0, SIZE, 1, SIZE, 1)
    return lambda: gemm.launch_kernels(args, SIZE, SIZE, SIZE, FLAGS, __import__("torch").float16, 2, None, 132)


def calls_of(driver, launch) -> Counter:
    before = Counter(driver.counts)
    launch()
    return driver.counts - before


def last_launch_maps(driver) -> list[int]:
    """The address each tensor map in the last launch's parameter buffer was encoded for (word 0 of the stub's map)."""
    launcher = next(launcher for kernel in KERNELS for launcher in kernel.launchers.values()
                    if launcher.tensor_maps is not None and launcher._prepared)
    raw = launcher.packer.raw_bytes()
    offsets = [launcher.packer.slots[r.param].offset for r in launcher.tensor_maps.recipes]
    return [int.from_bytes(raw[o:o + 8], "little") for o in offsets]


@pytest.mark.parametrize("launch", [kernel_launch, op_launch], ids=["gemm_kernel", "op-small-m"])
def test_a_warm_gemm_launch_is_one_driver_call_and_no_tensor_map_encode(hopper, launch):
    first = calls_of(hopper, launch(C))
    assert first["cuTensorMapEncodeTiled"] == 3, "A's and B's maps for the TMA loads, C's for the TMA store"
    launch(C)()
    assert calls_of(hopper, launch(C)) == Counter(cuLaunchKernel=1)


@pytest.mark.parametrize("launch", [kernel_launch, op_launch], ids=["gemm_kernel", "op-small-m"])
def test_a_new_output_encodes_its_map_once_and_the_buffer_holds_the_launchs_own_maps(hopper, launch):
    for _ in range(2):
        launch(C)()
    assert calls_of(hopper, launch(OTHER_C)) == Counter(cuTensorMapEncodeTiled=1, cuLaunchKernel=1)
    assert last_launch_maps(hopper) == [A.address, B.address, OTHER_C.address]
    assert calls_of(hopper, launch(C)) == Counter(cuLaunchKernel=1), "C's map is kept: copied back, not encoded"
    assert last_launch_maps(hopper) == [A.address, B.address, C.address]
    launched = [call for call in hopper.calls if call[0] == "cuLaunchKernel"]
    assert len({call[1] for call in launched[-3:]}) == 1, "one kernel, its maps rewritten in place"
