"""`print` / `device_print` and `device_assert` on the GPU, in debug builds.

The specification: a debug build (`debug=True` or TESSERA_DEBUG=1) keeps
device-side print and assert. On NVIDIA each thread prints with vprintf
("pid (x, y, z) thread t: prefix values...") and a failed assert prints
"device assertion failed at file:line: message" and traps; on AMD an
assert traps, and a print is a CompileError at its line saying why. Other
builds drop both (the thread IR's notes say so). The SIMT simulator runs the
debug thread IR: it prints per thread and fails the assert as the
interpreter does.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import tessera
from tessera.backends.nvptx.ptxas import find_ptxas
from tessera.backends.simt import run_threads
from tessera.ir.parser import parse_module


@tessera.kernel
def checked(x_ptr, n, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    x = tessera.load(x_ptr + offs, mask=offs < n, other=0.0)
    print("x is", x, n)
    tessera.device_assert(x >= 0, "x must be non-negative (100%)")


def line_of(text: str) -> int:
    lines, first = inspect.getsourcelines(checked.fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_a_debug_build_prints_with_vprintf_and_traps_on_a_failed_assert(target):
    compiled = checked.compile(np.zeros(16, np.float32), 16, BLOCK=16, target=target, debug=True)
    ptx = compiled.stages["ptx"]
    assert "vprintf" in ptx and "trap;" in ptx
    assert f"device assertion failed at {inspect.getsourcefile(checked.fn)}:{line_of('device_assert')}" in \
        compiled.stages["llvm_ir"]
    assert "x must be non-negative (100%%)" in compiled.stages["llvm_ir"]      # a literal %, for printf
    assert (compiled.binary is not None) == (find_ptxas() is not None)


def test_other_builds_drop_print_and_assert_with_a_note(monkeypatch):
    monkeypatch.delenv("TESSERA_DEBUG", raising=False)
    plain = checked.compile(np.zeros(16, np.float32), 16, BLOCK=16, target="sm_80")
    assert "vprintf" not in plain.stages["ptx"] and "trap" not in plain.stages["ptx"]
    assert plain.stages["thread_ir"].count("dropped: device-side") == 2
    monkeypatch.setenv("TESSERA_DEBUG", "1")
    assert "vprintf" in checked.compile(np.zeros(16, np.float32), 16, BLOCK=16, target="sm_80").stages["ptx"]


def test_the_simulator_prints_per_thread_and_fails_the_assert(capsys):
    compiled = checked.compile(np.zeros(16, np.float32), 16, BLOCK=16, target="sm_80", num_warps=1, debug=True)
    fn = parse_module(compiled.stages["thread_ir"]).functions[0]
    run_threads(fn, [np.arange(16, dtype=np.float32), 16], (1,))
    out = capsys.readouterr().out
    assert "pid (0, 0, 0) thread 0 x is" in out and "thread 31 x is" in out
    with pytest.raises(tessera.InterpreterError, match=r"assertion failed: x must be non-negative \(100%\)"):
        run_threads(fn, [np.arange(16, dtype=np.float32) - 3, 16], (1,))


def test_amd_traps_on_a_failed_assert_and_refuses_print_at_its_line():
    @tessera.kernel
    def assert_only(x_ptr, BLOCK: tessera.constexpr):
        tessera.device_assert(tessera.load(x_ptr + tessera.arange(0, BLOCK)) >= 0, "negative")

    compiled = assert_only.compile(np.zeros(64, np.float32), BLOCK=64, target="gfx942", debug=True)
    assert "s_trap" in compiled.stages["amdgcn"]
    with pytest.raises(tessera.CompileError) as info:
        checked.compile(np.zeros(16, np.float32), 16, BLOCK=16, target="gfx942", debug=True)
    assert info.value.line == line_of('print("x is"')
    assert "needs the ROCm device library's printf" in info.value.message
    assert "TESSERA_INTERPRET=1" in info.value.message
