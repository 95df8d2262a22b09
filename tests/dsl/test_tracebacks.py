"""A kernel error that ends a program is shown like a SyntaxError: the user's frames, then tessera's message
with the kernel's line; TESSERA_TRACEBACK=1 shows the compiler's frames too; caught errors keep them all."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tessera

BAD_KERNEL = """
import numpy as np, tessera

@tessera.kernel
def bad(x_ptr, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    tessera.store(x_ptr + offs, {value})

x = np.zeros(16, np.float32)
bad[(1,)](x, BLOCK={block})
"""


def run(tmp_path, value="undefined_name", block=16, env=None, prelude=""):
    script = tmp_path / "user_program.py"
    script.write_text(prelude + textwrap.dedent(BAD_KERNEL.format(value=value, block=block)))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env={**__import__("os").environ, **(env or {})})
    assert done.returncode == 1
    return done.stderr


def test_a_compile_error_shows_only_the_users_frame_and_the_message(tmp_path):
    err = run(tmp_path)
    assert err.count('File "') == 1 and 'user_program.py", line 10, in <module>' in err
    assert err.splitlines()[-5:] == [
        f"tessera.dsl.errors.UnknownNameError: kernel 'bad' at {tmp_path / 'user_program.py'}:7:33:",
        "    tessera.store(x_ptr + offs, undefined_name)",
        "                                ^",
        "unknown name 'undefined_name'",
        "(tessera's own frames are hidden; TESSERA_TRACEBACK=1 shows them)"]


def test_an_interpreter_error_is_shown_the_same_way(tmp_path):
    err = run(tmp_path, value="tessera.load(x_ptr + offs + 100)", block=16)    # reads past the array's end
    assert err.count('File "') == 1 and "InterpreterError" in err and "hidden" in err


def test_tessera_traceback_1_shows_every_frame(tmp_path):
    err = run(tmp_path, env={"TESSERA_TRACEBACK": "1"})
    assert err.count('File "') > 5 and "tracer.py" in err and "hidden" not in err


def test_a_hook_the_program_installed_first_is_left_alone(tmp_path):
    err = run(tmp_path, prelude="import sys\nsys.excepthook = lambda *a: print('own hook', file=sys.stderr)\n")
    assert err.strip() == "own hook"


def test_a_caught_error_keeps_its_whole_traceback():
    @tessera.kernel
    def bad(x_ptr, BLOCK: tessera.constexpr):
        tessera.store(x_ptr + tessera.arange(0, BLOCK), undefined_name)  # noqa: F821

    with pytest.raises(tessera.CompileError) as info:
        bad[(1,)](np.zeros(16, np.float32), BLOCK=16)
    assert any("tracer.py" in entry.path.name or entry.path.name == "tracer.py" for entry in info.traceback)
