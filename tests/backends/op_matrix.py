"""Compile every op on every supported dtype for some targets, one child process per target.

LLVM aborts the process on a pattern it cannot select, so each backend's
op x dtype matrix test compiles `nvptx_programs.every_op_kernel` for every
dtype in child processes: an abort fails the test naming the target and
dtype instead of killing pytest. `problems` lists what went wrong (empty
when every dtype compiled).
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
from tessera.ir import dtypes as dt
from tessera.ir.parser import parse_module
{setup}
for name in {dtypes!r}:
    print("START", name, flush=True)
    text = every_op_kernel(dt.dtype_from_name(name), n=2, {kernel_options})
    fn = parse_module(text).functions[0]
    try:
        compile_thread_ir(fn, {target!r})
    except Exception as e:
        print("FAIL", name, type(e).__name__, str(e).replace("\\\\n", " | ")[:3000], flush=True)
    else:
        print("OK", name, flush=True)
"""


def problems(setup: str, kernel_options: str, targets: tuple[str, ...]) -> list[str]:
    """Run the matrix for `targets`: `setup` imports `compile_thread_ir` (and what `kernel_options` names)."""
    dtypes = [d.name for d in SUPPORTED]
    children = {
        target: subprocess.Popen([sys.executable, "-c", CHILD.format(here=str(HERE), setup=setup, dtypes=dtypes,
                                                                    kernel_options=kernel_options, target=target)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for target in targets
    }
    found = []
    for target, child in children.items():
        out, err = child.communicate(timeout=600)
        lines = out.splitlines()
        if child.returncode != 0:
            started = [line.split()[1] for line in lines if line.startswith("START")]
            crashed_on = started[-1] if started else "?"
            found.append(f"{target}: the child died (status {child.returncode}) compiling {crashed_on}: {err[-2000:]}")
        found += [f"{target}: {line}" for line in lines if line.startswith("FAIL")]
        done = [line.split()[1] for line in lines if line.startswith("OK")]
        if child.returncode == 0 and done != dtypes:
            found.append(f"{target}: compiled {done}, expected {dtypes}; stderr: {err[-2000:]}")
    return found
