"""The `gpu` marker, not a test's name or parameter ids, decides which tests skip without a driver."""

import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__)


@pytest.mark.parametrize("scope", ["cta", "gpu"])
def test_a_parameter_named_gpu(scope):
    """Runs on every machine: only its id says "gpu"."""
    assert scope in ("cta", "gpu")


def test_a_cpu_test_whose_id_says_gpu_runs_without_a_driver():
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                           f"{HERE}::test_a_parameter_named_gpu[gpu]"],
                          capture_output=True, text=True, timeout=120, cwd=HERE.parents[1])
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr
