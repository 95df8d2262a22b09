"""Every op on every supported dtype compiles for gfx90a, gfx942 and gfx950 without LLVM aborting.

The AMDGPU validator admits only these dtypes and ops (and the math
`amdgpu.math.math_support` allows), so each combination goes through
instruction selection here, in one child process per target: an LLVM abort
fails this test naming the dtype instead of killing pytest.
"""

import subprocess
import sys
from pathlib import Path

from nvptx_programs import SUPPORTED

HERE = Path(__file__).parent
CHILD = """
import sys
sys.path.insert(0, {here!r})
from nvptx_programs import every_op_kernel
from tessera.backends.amdgpu import compile_thread_ir
from tessera.backends.amdgpu.math import math_support
from tessera.ir import dtypes as dt
from tessera.ir.parser import parse_module
for name in {dtypes!r}:
    print("START", name, flush=True)
    text = every_op_kernel(dt.dtype_from_name(name), n=2, math_support=math_support, warp_size=64)
    fn = parse_module(text).functions[0]
    try:
        artifacts = compile_thread_ir(fn, {target!r})
    except Exception as e:
        print("FAIL", name, type(e).__name__, str(e).replace("\\n", " | ")[:3000], flush=True)
    else:
        print("OK", name, "hsaco" if artifacts.hsaco else "object", flush=True)
"""


def test_every_op_on_every_dtype_compiles_for_every_amd_target():
    dtypes = [d.name for d in SUPPORTED]
    children = {
        target: subprocess.Popen([sys.executable, "-c", CHILD.format(here=str(HERE), dtypes=dtypes, target=target)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for target in ("gfx90a", "gfx942", "gfx950")
    }
    problems = []
    for target, child in children.items():
        out, err = child.communicate(timeout=600)
        lines = out.splitlines()
        if child.returncode != 0:
            started = [line.split()[1] for line in lines if line.startswith("START")]
            crashed_on = started[-1] if started else "?"
            problems.append(f"{target}: the child died (status {child.returncode}) compiling {crashed_on}: "
                            f"{err[-2000:]}")
        problems += [f"{target}: {line}" for line in lines if line.startswith("FAIL")]
        done = [line.split()[1] for line in lines if line.startswith("OK")]
        if child.returncode == 0 and done != dtypes:
            problems.append(f"{target}: compiled {done}, expected {dtypes}; stderr: {err[-2000:]}")
    assert not problems, "\n".join(problems)
