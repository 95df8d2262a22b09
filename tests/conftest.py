"""Suite-wide fixtures, the `gpu` marker's skip rule, and the isolation of GPU tests from a CUDA context an earlier
one broke (`gpu_isolation.py`)."""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` skip cleanly on machines without an NVIDIA driver, and those also marked `amdgpu`
    on machines without ROCm's runtime (both checked without initializing either)."""
    from tessera.runtime import cuda, hip

    skip_nvidia = pytest.mark.skip(reason="needs an NVIDIA GPU and its driver")
    skip_amd = pytest.mark.skip(reason="needs an AMD GPU and ROCm (libamdhip64.so)")
    for item in items:                           # markers, not keywords: a parameter id "gpu" is no GPU test
        if item.get_closest_marker("amdgpu"):
            if not hip.driver_available():
                item.add_marker(skip_amd)
        elif item.get_closest_marker("gpu") and not cuda.driver_available():
            item.add_marker(skip_nvidia)


@pytest.fixture(autouse=True, scope="session")
def children_import_this_checkout():
    """Python child processes that tests start (scripts that `import tessera`) import the tessera under test,
    not whatever copy is installed, or none."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    yield
    mp.undo()


@pytest.fixture(autouse=True, scope="session")
def private_binary_cache(tmp_path_factory):
    """Tests never read or write the user's ~/.cache/tessera."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TESSERA_CACHE_DIR", str(tmp_path_factory.mktemp("tessera-cache")))
    yield
    mp.undo()


# --- one GPU test's sticky CUDA error must not fail the rest of its process (`gpu_isolation.py`) -------------

POISONED = pytest.StashKey()            # config.stash: the Poisoning found after a GPU test, once found


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """After a `gpu` test's call, synchronize the CUDA contexts in use; if one fails, this test fails with a
    message naming it (whatever its own outcome), and the process is marked poisoned."""
    outcome = yield
    if call.when != "call" or POISONED in item.config.stash or not item.get_closest_marker("gpu"):
        return              # (a CPU test may have put a fake torch in sys.modules: no probe looks at it)
    from gpu_isolation import check_after_test, context_probes

    poisoning = check_after_test(item.nodeid, bool(item.get_closest_marker("gpu")), context_probes(),
                                 under_xdist=hasattr(item.config, "workerinput"))
    if poisoning is None:
        return
    item.config.stash[POISONED] = poisoning
    report = outcome.get_result()
    report.outcome = "failed"
    report.longrepr = f"{report.longrepr}\n\n{poisoning.message()}" if report.longrepr else poisoning.message()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """An xdist worker whose context the test just run poisoned ends once its reports are sent: xdist then
    reports that test as crashed and starts a fresh worker (with a fresh context) for the tests still to run."""
    yield
    poisoning = item.config.stash.get(POISONED, None)
    if poisoning is not None and poisoning.action == "exit" and poisoning.nodeid == item.nodeid:
        sys.stderr.write(f"\n{poisoning.message()}: ending this pytest-xdist worker\n")
        sys.stderr.flush()
        os._exit(3)


def pytest_runtest_setup(item):
    """In a single process, a GPU test after the poisoning fails at once, naming the test that caused it."""
    poisoning = item.config.stash.get(POISONED, None)
    if poisoning is not None and item.get_closest_marker("gpu"):
        pytest.fail(f"not run: {poisoning.message()} (run `pytest -n N` to give each test a fresh process after "
                    f"such a failure)", pytrace=False)

