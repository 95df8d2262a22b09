"""Every tutorial runs on the CPU and checks itself against numpy."""

import runpy
from pathlib import Path

import pytest

TUTORIALS = sorted((Path(__file__).resolve().parents[1] / "tutorials").glob("[0-9][0-9]-*.py"))
NEEDS_TORCH = {"05-pytorch-ops", "08-fusion"}     # PyTorch ops need PyTorch (an optional dependency)


def test_there_are_tutorials():
    assert len(TUTORIALS) >= 3


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.stem)
def test_tutorial_runs_and_matches_numpy(path, capsys):
    if path.stem in NEEDS_TORCH:
        pytest.importorskip("torch")
    runpy.run_path(str(path), run_name="__main__")     # each asserts against numpy itself
    assert "matches numpy" in capsys.readouterr().out
