"""Lets the language tests import the tile interpreter tests' kernels (`cooperative_kernels`), which they share."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "interp"))
