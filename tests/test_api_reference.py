"""The API reference (docs/API.md) and help() say what the docstrings say: every public language function has
a docstring and its real signature, and the committed page is regenerated from them."""

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import tessera
from tessera.dsl.values import BUILTINS

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_every_builtin_has_its_docstring_and_signature(name):
    builtin = BUILTINS[name]
    assert builtin.__doc__ and builtin.__doc__ == builtin.doc, name
    parameters = list(inspect.signature(builtin).parameters)
    assert parameters == list(inspect.signature(builtin.impl).parameters)[1:]      # without the tracer's ctx


def test_help_shows_the_language_function_not_the_builtin_class():
    text = __import__("pydoc").render_doc(tessera.load, renderer=__import__("pydoc").plaintext)
    assert "load(pointer, mask=None, other=None, layout=None, sem=None, scope=None)" in text
    assert "A language function usable inside kernels" not in text
    assert repr(tessera.load) == "<tessera.load>" and repr(tessera.f32) == "tessera.f32"


def test_the_committed_api_reference_is_up_to_date():
    done = subprocess.run([sys.executable, str(ROOT / "docs" / "build_api.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
