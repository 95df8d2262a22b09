"""The tile-IR pass list: the passes the compiler runs on tile IR, in order.

`default_tile_passes()` cleans up tile IR straight from the frontend:
canonicalize (fold constants, apply identities, resolve known control flow),
then CSE (merge the twins that folding exposes), then DCE (drop what no
longer has a use). Run them with `PassManager(default_tile_passes())`.
"""

from __future__ import annotations

from .canonicalize import Canonicalize
from .cse import CSE
from .dce import DCE


def default_tile_passes() -> list:
    """Fresh pass objects for tile IR, in the order they run."""
    return [Canonicalize(), CSE(), DCE()]
