"""Every op on every supported dtype compiles for sm_80 and sm_90a without LLVM aborting.

This is what lets `compile_thread_ir` run LLVM in-process by default: the
validator admits only these dtypes and ops, and here each combination goes
through instruction selection (and ptxas, where installed). The kernels are
compiled in child processes, one per target, so that an LLVM abort fails
this test, naming the dtype, instead of killing pytest.
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
from tessera.backends.nvptx import compile_thread_ir, find_libdevice
from tessera.ir import dtypes as dt
from tessera.ir.parser import parse_module
for name in {dtypes!r}:
    print("START", name, flush=True)
    text = every_op_kernel(dt.dtype_from_name(name), n=2, libdevice=find_libdevice() is not None)
    fn = parse_module(text).functions[0]
    try:
        artifacts = compile_thread_ir(fn, {target!r})
    except Exception as e:
        print("FAIL", name, type(e).__name__, str(e).replace("\\n", " | ")[:3000], flush=True)
    else:
        print("OK", name, "cubin" if artifacts.cubin else "ptx", flush=True)
"""


def test_every_op_on_every_dtype_compiles_for_sm_80_and_sm_90a():
    dtypes = [d.name for d in SUPPORTED]
    children = {
        target: subprocess.Popen([sys.executable, "-c", CHILD.format(here=str(HERE), dtypes=dtypes, target=target)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for target in ("sm_80", "sm_90a")
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
