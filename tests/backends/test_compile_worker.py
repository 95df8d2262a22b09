"""The compile worker: LLVM runs in a child process reused across compiles, so that an LLVM abort or a compile
that never ends is an exception in the user's process, never its end (tessera/backends/llvm/worker.py, run.py)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tessera.backends.llvm import run, worker
from tessera.backends.llvm.errors import BackendError, CompileTimeoutError
from tessera.backends.nvptx.compile import compile_thread_ir
from tessera.ir.parser import parse_module

from test_nvptx import ABORTING, vector_add

ADD = parse_module(vector_add("f32", 4)).functions[0]


# Stand-ins for optimize.py that speak its protocol but never answer, or die on the first request.
NEVER_ANSWERS = "import sys, time\nfor line in sys.stdin:\n    time.sleep(3600)\n"
ABORTS = "import os, sys\nfor line in sys.stdin:\n    sys.stderr.write('the last words\\n'); sys.stderr.flush(); os.abort()\n"


def _fake_worker(tmp_path, source: str) -> worker.Worker:
    script = tmp_path / "fake_worker.py"
    script.write_text(source)
    return worker.Worker(script)


def _ptx(**options) -> str:
    return compile_thread_ir(ADD, "sm_80", assemble=False, **options).ptx


def test_llvm_runs_in_one_worker_reused_across_compiles():
    first = _ptx()
    pid = worker.current().pid
    assert pid is not None and pid != os.getpid()
    assert _ptx() == first
    assert worker.current().pid == pid


def test_the_worker_and_this_process_emit_the_same_ptx():
    assert _ptx(isolate=True) == _ptx(isolate=False)


def test_an_llvm_abort_is_a_backend_error_and_the_next_compile_gets_a_new_worker():
    _ptx()
    before = worker.current().pid
    with pytest.raises(BackendError, match="Cannot select") as info:
        run.run_llvm_isolated(ABORTING, "NVPTX")
    message = str(info.value)
    assert "kernel 'k' for sm_80" in message and "this process is unharmed" in message and "SIGABRT" in message
    assert ".entry vadd" in _ptx()
    assert worker.current().pid not in (None, before)


def test_a_worker_killed_between_compiles_is_restarted_silently():
    _ptx()
    pid = worker.current().pid
    os.kill(pid, signal.SIGKILL)
    assert ".entry vadd" in _ptx()
    assert worker.current().pid != pid


def test_a_compile_past_the_time_limit_is_stopped_and_names_kernel_target_and_limit(tmp_path):
    fake = _fake_worker(tmp_path, NEVER_ANSWERS)
    start = time.monotonic()
    with pytest.raises(CompileTimeoutError) as info:
        worker.compile_in_worker(ABORTING, timeout_s=0.5, backend="NVPTX", worker=fake)
    assert time.monotonic() - start < 10
    assert "kernel 'k' for sm_80 within the 0.5 s limit" in str(info.value)
    assert "TESSERA_COMPILE_TIMEOUT" in str(info.value)
    assert (info.value.kernel, info.value.target, info.value.limit_s) == ("k", "sm_80", 0.5)
    assert fake.pid is None, "the hung worker is stopped"


def test_a_crash_quotes_what_the_worker_wrote_last(tmp_path):
    fake = _fake_worker(tmp_path, ABORTS)
    with pytest.raises(BackendError, match="the last words") as info:
        worker.compile_in_worker(ABORTING, timeout_s=30, backend="NVPTX", worker=fake)
    assert "killed by SIGABRT" in str(info.value)


def test_the_time_limit_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(run.TIMEOUT_ENV, raising=False)
    assert run.compile_timeout() == run.DEFAULT_TIMEOUT_S
    monkeypatch.setenv(run.TIMEOUT_ENV, "2.5")
    assert run.compile_timeout() == 2.5
    for bad in ("soon", "0", "-3", "nan"):
        monkeypatch.setenv(run.TIMEOUT_ENV, bad)
        with pytest.raises(BackendError, match="positive number of seconds"):
            run.compile_timeout()


def test_isolation_is_on_unless_switched_off(monkeypatch):
    monkeypatch.delenv(run.ISOLATE_ENV, raising=False)
    assert run.isolation_enabled()
    for off in ("0", "false", "no"):
        monkeypatch.setenv(run.ISOLATE_ENV, off)
        assert not run.isolation_enabled()

    def no_worker(*args, **kwargs):
        raise AssertionError("TESSERA_ISOLATE=0 must compile in this process")

    monkeypatch.setattr(worker, "compile_in_worker", no_worker)
    assert ".entry vadd" in _ptx()


# LLVM 22's AMDGPU code generation never finishes this module (its DAG combiner turns the v1i64 zero_extend into a
# BUILD_VECTOR and back, forever); Tessera no longer emits such a <1 x ptr> GEP (see test_compile_time_bounds.py).
HANGS = {"kernel": "k", "triple": "amdgcn-amd-amdhsa", "cpu": "gfx942", "features": "", "emit_object": True,
         "llvm_ir": """\
target triple = "amdgcn-amd-amdhsa"
define amdgpu_kernel void @k(ptr addrspace(1) %out) {
entry:
  %x = tail call i32 @llvm.amdgcn.workitem.id.x()
  %v = insertelement <1 x ptr addrspace(1)> poison, ptr addrspace(1) %out, i64 0
  %r.lhs.trunc = trunc i32 %x to i8
  %r1 = urem i8 %r.lhs.trunc, 3
  %r.zext = zext i8 %r1 to i32
  %rv = insertelement <1 x i32> poison, i32 %r.zext, i64 0
  %w = zext <1 x i32> %rv to <1 x i64>
  %p = getelementptr i32, <1 x ptr addrspace(1)> %v, <1 x i64> %w
  %q = extractelement <1 x ptr addrspace(1)> %p, i64 0
  store i32 %x, ptr addrspace(1) %q, align 4
  ret void
}
declare noundef range(i32 0, 1024) i32 @llvm.amdgcn.workitem.id.x()
"""}


def test_llvm_stuck_in_a_loop_is_stopped_at_the_limit():
    try:
        run.run_llvm_isolated(HANGS, "AMDGPU", timeout_s=2)
    except CompileTimeoutError as e:
        assert "kernel 'k' for gfx942 within the 2 s limit" in str(e)
    else:
        pytest.skip("this LLVM compiles the module: the hang is fixed upstream")
    assert ".entry vadd" in _ptx(), "the next compile gets a new worker"


ORPHAN = textwrap.dedent("""
    import os, sys, threading, time
    from tessera.backends.llvm import run, worker
    from test_compile_worker import HANGS
    threading.Thread(target=run.run_llvm_isolated, args=(HANGS,), daemon=True).start()
    while worker.current().pid is None:
        time.sleep(0.01)
    print(worker.current().pid, flush=True)
    time.sleep(1)
    os._exit(0)        # no atexit, no cleanup: as if the process were killed mid-compile
""")


def test_the_worker_ends_when_its_process_dies_even_mid_compile():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), *sys.path])}
    child = subprocess.run([sys.executable, "-c", ORPHAN], capture_output=True, text=True, timeout=60, env=env)
    pid = int(child.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    assert not _alive(pid), "an orphaned worker must end by itself"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:      # a zombie has ended, it is just not reaped yet
        return stat.read().split(")")[-1].split()[0] != "Z"
