"""A GPU test that breaks the CUDA context fails (or, under pytest-xdist, ends its worker) and names itself,
instead of failing every later test in its process (`gpu_isolation.py`, `conftest.py`); checked on the CPU
with probes and a driver that fail on purpose."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_isolation import Poisoning, check_after_test, context_error, context_probes

HERE = Path(__file__).resolve().parent
ILLEGAL = "CUDA error: an illegal memory access was encountered"


def raising(message):
    def probe():
        raise RuntimeError(message)
    return probe


def test_a_context_that_synchronizes_is_not_poisoned():
    assert check_after_test("t.py::ok", True, [lambda: None, lambda: None], under_xdist=True) is None


def test_a_failing_synchronize_poisons_and_the_action_depends_on_the_process():
    for under_xdist, action in ((True, "exit"), (False, "fail")):
        poisoning = check_after_test("t.py::bad", True, [lambda: None, raising(ILLEGAL)], under_xdist=under_xdist)
        assert poisoning == Poisoning("t.py::bad", f"RuntimeError: {ILLEGAL}", action)
        assert "unusable after t.py::bad" in poisoning.message() and ILLEGAL in poisoning.message()


def test_tests_not_marked_gpu_run_no_probe():
    assert check_after_test("t.py::cpu", False, [raising("must not run")], under_xdist=False) is None


def test_the_first_error_is_reported():
    assert context_error([raising("first"), raising("second")]) == "RuntimeError: first"


def test_no_probe_initializes_cuda_on_a_machine_without_a_gpu():
    """torch imported but its CUDA not initialized, and Tessera's runtime never opened a device: no probes."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_initialized():
        pytest.skip("this process already uses CUDA")
    from tessera.runtime import cuda
    if cuda._devices:
        pytest.skip("this process already opened a GPU")
    assert context_probes() == []
    assert not torch.cuda.is_initialized()



def test_a_stand_in_torch_without_cuda_gives_no_probe(monkeypatch):
    """CPU tests put minimal fake `torch` modules in sys.modules (tests/runtime/test_launcher.py): the probe
    list is then empty rather than an AttributeError that would end the worker."""
    import types
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    monkeypatch.delitem(sys.modules, "tessera.runtime.cuda", raising=False)
    assert context_probes() == []

# --- end to end, in a child pytest over a folder with this suite's conftest ------------------------------------

BROKEN_DRIVER = '''
"""Plugin: the GPU tests are not skipped (a driver is 'available'); a test can break the one open device."""
from tessera.runtime import cuda
from tessera.runtime.errors import LaunchError



def pytest_configure(config):       # only as a plugin (-p broken_driver), not when a test imports it
    cuda.driver_available = lambda: True


class BrokenDevice:
    def synchronize(self):
        raise LaunchError("cuCtxSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was "
                          "encountered)")


def break_the_context():
    cuda._initialized = True
    cuda._devices[0] = BrokenDevice()
'''

TESTS = '''
import pytest
import broken_driver


@pytest.mark.gpu
def test_1_breaks_the_context():
    broken_driver.break_the_context()


@pytest.mark.gpu
def test_2_later_gpu_test():
    pass


def test_3_cpu_test():
    pass
'''


def child_pytest(tmp_path, *args, driver=True):
    """pytest in a child process over a folder holding this suite's conftest and the tests above."""
    for name in ("conftest.py", "gpu_isolation.py"):
        shutil.copy(HERE / name, tmp_path / name)
    (tmp_path / "broken_driver.py").write_text(BROKEN_DRIVER)
    (tmp_path / "test_child.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a GPU\n    amdgpu: needs ROCm\n")
    plugins = ["-p", "broken_driver"] if driver else []
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *plugins, *args,
                           str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": f"{tmp_path}:{HERE.parent}"})
    return done.returncode, done.stdout + done.stderr


def test_in_one_process_the_breaking_test_fails_and_later_gpu_tests_fail_naming_it(tmp_path):
    code, out = child_pytest(tmp_path)
    assert code == 1, out
    assert "FAILED test_child.py::test_1_breaks_the_context" in out
    assert "the CUDA context is unusable after test_child.py::test_1_breaks_the_context" in out
    assert "LaunchError: cuCtxSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS" in out
    assert re.search(r"ERROR at setup of test_2_later_gpu_test _+\nnot run: the CUDA context is unusable after "
                     r"test_child.py::test_1_breaks_the_context", out), out
    assert "ERROR test_child.py::test_2_later_gpu_test" in out
    assert "PASSED test_child.py::test_3_cpu_test" in out


def test_under_xdist_the_breaking_test_crashes_its_worker_and_the_rest_run_in_a_fresh_one(tmp_path):
    pytest.importorskip("xdist")
    code, out = child_pytest(tmp_path, "-n", "1", "--max-worker-restart", "4")
    assert code == 1, out
    assert "crashed while running 'test_child.py::test_1_breaks_the_context'" in out
    assert "PASSED test_child.py::test_2_later_gpu_test" in out and "PASSED test_child.py::test_3_cpu_test" in out


def test_without_a_gpu_the_gpu_tests_skip_cleanly(tmp_path):
    code, out = child_pytest(tmp_path, "-m", "gpu", driver=False)
    assert code == 0 and "2 skipped, 1 deselected" in out, out
