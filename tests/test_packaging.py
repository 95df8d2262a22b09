"""What a user gets from the distribution: the license, type information, and a clear message when an optional
dependency is missing."""

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_license_is_an_spdx_expression_with_its_text_shipped():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]


def test_the_package_says_it_is_typed():
    assert (ROOT / "tessera" / "py.typed").is_file()
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data["tessera"]


def test_the_kernel_library_without_torch_names_the_extra_to_install():
    code = "import sys; sys.modules['torch'] = None; import tessera.kernels_lib"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 1
    assert "ImportError: tessera.kernels_lib needs PyTorch: pip install 'tessera[torch]'" in done.stderr


def test_tessera_itself_imports_without_torch():
    code = "import sys; sys.modules['torch'] = None; import tessera; print(tessera.__version__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
