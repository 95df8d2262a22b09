"""Every low-bit type compiles for sm_80, sm_90a and gfx942: through ptxas and ld.lld, without spills.

Each target compiles, in a child process (an LLVM abort fails the test
instead of killing pytest), the tile kernel `low_bit_programs.roundtrip`
(the low-bit pass's byte loads, unpacks, packs and byte stores) for every
sub-byte type, fp8 and e8m0 on sm_90a, and for one type of each width
family on sm_80 and gfx942; with sizes not known to be multiples of 16
(the per-element path and its atomics) for u1, i3 and fp6 on sm_90a; and one thread-IR kernel putting every
op on registers of those types. A binary comes out of each (a cubin
from ptxas; an hsaco from ld.lld) and ptxas reports no spills.
"""

import subprocess
import sys
from pathlib import Path

import pytest
from low_bit_programs import LOW_BIT, REPRESENTATIVES

from tessera.backends.amdgpu import find_linker
from tessera.backends.nvptx import find_ptxas
from tessera.ir import dtypes as dt

HERE = Path(__file__).parent
CHILD = """
import sys
sys.path.insert(0, {here!r})
from low_bit_programs import LOW_BIT, REPRESENTATIVES, register_ops_kernel, roundtrip, roundtrip_signature
from tessera.ir import dtypes as dt
from tessera.ir.parser import parse_module
from tessera.backends.{backend} import compile_thread_ir
target = {target!r}
for dtype, divisible in {cases}:
    block = dict(BK=32, BN=128) if divisible else dict(BK=16, BN=64)
    c = roundtrip.compile(signature=roundtrip_signature(dtype, divisible), target=target, **block)
    print("roundtrip", dtype.name, divisible, c.binary is not None, c.metadata.get("spill_stores", 0), flush=True)
fn = parse_module(register_ops_kernel(REPRESENTATIVES, warp_size={warp})).functions[0]
artifacts = compile_thread_ir(fn, target)
binary = getattr(artifacts, "cubin", None) or getattr(artifacts, "hsaco", None)
spills = (getattr(artifacts, "ptxas_info", None) or {{}}).get("spill_stores", 0)
print("register_ops", binary is not None, spills, flush=True)
"""
# sm_90a: every type's packed path and the per-element path of three; elsewhere the
# representatives' packed path (the code differs per type only in constants, and the JIT tests check those).
EVERY = "[(d, True) for d in LOW_BIT] + [(d, False) for d in (dt.u1, dt.i3, dt.f6e3m2)]"
SOME = "[(d, True) for d in REPRESENTATIVES]"
TARGETS = {"sm_80": ("nvptx", 32, SOME), "sm_90a": ("nvptx", 32, EVERY), "gfx942": ("amdgpu", 64, SOME)}


@pytest.fixture(scope="module")
def reports():
    children = {target: subprocess.Popen(
        [sys.executable, "-c", CHILD.format(here=str(HERE), backend=backend, target=target, warp=warp, cases=cases)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for target, (backend, warp, cases) in TARGETS.items()}
    return {target: (child.communicate(timeout=600), child.returncode) for target, child in children.items()}


@pytest.mark.parametrize("target", TARGETS)
def test_every_low_bit_type_compiles_to_a_binary_without_spills(reports, target):
    (out, err), status = reports[target]
    assert status == 0, f"{target}: the child died (status {status}):\n{err[-3000:]}\n{out[-1000:]}"
    lines = out.splitlines()
    assert len(lines) == len(eval(TARGETS[target][2], {"dt": dt, "LOW_BIT": LOW_BIT,
                                                       "REPRESENTATIVES": REPRESENTATIVES})) + 1
    has_tool = (find_ptxas() if target.startswith("sm") else find_linker()) is not None
    for line in lines:
        *what, binary, spills = line.split()
        assert binary == str(has_tool) and spills in ("0", "None"), f"{target}: {line}"
