"""Transformations of IR: the tile-IR pass list (`tile_passes.py`: canonicalize, CSE, DCE) and the tile
-> thread passes (`thread_passes.py`: alignment, layout assignment, per-op lowering in `lowering/` with
the scheduling transforms of `schedule/`, shared-memory allocation). It may import `tessera.ir` only.
"""
