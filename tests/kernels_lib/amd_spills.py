"""What an AMD kernel spills, from its code object's metadata: the no-spill tests' one check for gfx targets.

A shipped config must spill neither kind of register on AMD: an SGPR spill is a v_writelane/v_readlane pair
around every use (in the loop, each iteration), a VGPR spill a scratch store and load. `bench/amd_registers.py`
prints the whole table.
"""

from __future__ import annotations

AMD_SPILL_FIELDS = ("sgpr_spill_count", "vgpr_spill_count", "private_segment_fixed_size")


def amd_spills(metadata: dict) -> dict:
    """The nonzero spill counts and scratch bytes in `metadata` ({} for a kernel that spills nothing)."""
    missing = [f for f in AMD_SPILL_FIELDS if f not in metadata]
    assert not missing, f"not an AMD kernel's metadata (no {missing}): {sorted(metadata)}"
    return {f: metadata[f] for f in AMD_SPILL_FIELDS if metadata[f]}
