"""Run a kernel everywhere a CPU can: the tile interpreter, then per target the SIMT simulator on the
kernel's thread IR and the target's assembler (ptxas) or linker (ld.lld).

    expected = run_everywhere(kernel, make_args, grid, BLOCK=128)

`make_args()` builds fresh arguments (numpy arrays are written in place).
The interpreter runs them through `kernel[grid](...)`; for each target the
kernel is compiled with `kernel.compile` (every stage, the binary when the
tool is installed) and its thread IR, parsed back from the compiled stage,
runs in the simulator on fresh arguments, which must come out bit for bit
as the interpreter's, NaN matching any NaN (the simulator gives NVIDIA's
canonical NaN) (or within `tolerance`, for sums a dot reorders). Returns the interpreter's arguments, to compare with
a numpy reference.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from tessera.backends.amdgpu.linker import find_linker
from tessera.backends.nvptx.ptxas import find_ptxas
from tessera.backends.simt import run_threads
from tessera.ir.parser import parse_module
from tessera.testing import assert_same_bits

TARGETS = ("sm_80", "sm_90a", "gfx942")


def run_everywhere(kernel, make_args: Callable[[], list], grid: tuple[int, ...], targets=TARGETS,
                   num_warps: int = 4, tolerance: dict | None = None, **constexprs) -> list:
    expected = make_args()
    kernel[grid](*expected, **constexprs)
    for target in targets:
        compiled = kernel.compile(*make_args(), target=target, num_warps=num_warps, **constexprs)
        tool = find_linker() if target.startswith("gfx") else find_ptxas()
        assert (compiled.binary is not None) == (tool is not None), target
        actual = make_args()
        run_threads(parse_module(compiled.stages["thread_ir"]).functions[0], actual, grid)
        for index, (want, got) in enumerate(zip(expected, actual)):
            if isinstance(want, np.ndarray) and tolerance is None:      # NaN matches NaN: the payload is the target's
                assert_same_bits(got, want, name=f"{target}: argument {index} (against the interpreter's)")
            elif isinstance(want, np.ndarray):
                np.testing.assert_allclose(got, want, **tolerance, err_msg=f"{target}: argument {index}")
    return expected
