"""Comparing a kernel's output with its reference, and saying *where* and *how* it is wrong.

A GPU result that differs from its reference is only useful if the run that saw it
records enough to find the cause later without a GPU (in the SIMT simulator). So
`assert_close` does not stop at "mismatched elements: 812 / 40000": its message
names the wrong rows, columns and lanes as ranges and tests the usual suspects:

* unwritten or zero-filled output (wrong elements exactly 0 or NaN),
* a transpose, a permutation of rows or columns, a shift by a whole tile,
* a periodic pattern (every row of one tile, one lane of every warp),
* for a matrix product, with `matmul=(a, b, block_k)`: which K-steps are missing or
  counted twice (a stale or skipped pipeline stage), by fitting the error to the
  per-K-step partial products.

Arrays may be numpy arrays or anything with `.detach().cpu()` (torch tensors);
only numpy is imported here.
"""

from __future__ import annotations

import numpy as np

__all__ = ["FP8_MMA_RELATIVE_ERROR", "assert_close", "assert_same_bits", "diagnose"]

# Relative error of one fp8 tensor-core dot product against exact arithmetic, per unit of sum |a_k b_k|: Hopper's
# fp8 MMA keeps only about 14 bits while it accumulates and truncates (DeepSeek-V3 report, section 3.3.2), so the
# float32 accumulator's 2^-24 does not hold. 2^-10 covers what an H100 showed (bench/results run 9, 2026-11-26):
# fp8 attention's LSE off by up to 0.037 where this bound gives at least 0.14, and an MoE w8a8 layer at 1.3x an
# allowance built on 2^-11.
FP8_MMA_RELATIVE_ERROR = 2.0 ** -10


def assert_close(actual, expected, *, rtol: float = 1e-5, atol: float = 1e-8, name: str = "output",
                 matmul: tuple | None = None) -> None:
    """Raise AssertionError with `diagnose`'s description unless |actual - expected| <= atol + rtol |expected|
    everywhere (NaN only where expected has NaN)."""
    actual, expected = _numpy(actual), _numpy(expected)
    if actual.shape != expected.shape:
        raise AssertionError(f"{name}: shape {actual.shape} where {expected.shape} was expected")
    if _wrong(actual, expected, rtol, atol).any():
        raise AssertionError(diagnose(actual, expected, rtol=rtol, atol=atol, name=name, matmul=matmul))


def assert_same_bits(actual, expected, *, name: str = "output") -> None:
    """Raise AssertionError unless numpy array `actual` holds `expected`'s bits element by element, where any NaN
    matches any NaN: a computed NaN's payload and sign are the hardware's (an NVIDIA GPU's float32 arithmetic
    returns 0x7FFFFFFF; x86, so numpy, and AMD GPUs keep an operand's), and no kernel should depend on them.
    Everything else must match exactly: -0.0 is not 0.0. The message names the first differing element and
    both bit patterns."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        raise AssertionError(f"{name}: {actual.dtype} {actual.shape} where {expected.dtype} {expected.shape} was "
                             f"expected")
    if actual.dtype.itemsize not in (1, 2, 4, 8):
        raise TypeError(f"{name}: assert_same_bits compares elements of 1, 2, 4 or 8 bytes, not {actual.dtype}")
    bits = np.dtype(f"u{actual.dtype.itemsize}")
    differ = actual.view(bits) != expected.view(bits)
    try:
        differ &= ~(np.isnan(actual) & np.isnan(expected))
    except TypeError:           # not a float dtype: every bit counts
        pass
    if differ.any():
        where = tuple(int(i) for i in np.argwhere(differ)[0])
        width = 2 * actual.dtype.itemsize
        raise AssertionError(f"{name}: {int(differ.sum())} of {differ.size} elements differ; the first at {where}: "
                             f"{actual[where].item()!r} (0x{int(actual.view(bits)[where]):0{width}x}) where "
                             f"{expected[where].item()!r} (0x{int(expected.view(bits)[where]):0{width}x}) was expected")


def diagnose(actual, expected, *, rtol: float = 1e-5, atol: float = 1e-8, name: str = "output",
             matmul: tuple | None = None) -> str:
    """A few lines saying which elements of `actual` are wrong and which known pattern explains them."""
    actual, expected = _numpy(actual), _numpy(expected)
    wrong = _wrong(actual, expected, rtol, atol)
    count = int(wrong.sum())
    lines = [f"{name}: {count} of {wrong.size} elements wrong (rtol={rtol:g}, atol={atol:g})"]
    if count == 0:
        return lines[0]
    bad_actual = actual[wrong]
    lines.append(f"  max |error| {np.nanmax(np.abs(bad_actual - expected[wrong])):.4g}; "
                 f"wrong elements that are 0: {int((bad_actual == 0).sum())}, NaN: {int(np.isnan(bad_actual).sum())}")
    grid = actual.reshape(-1, actual.shape[-1]) if actual.ndim >= 2 else actual.reshape(1, -1)
    want = expected.reshape(grid.shape)
    mask = wrong.reshape(grid.shape)
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    if grid.shape[0] > 1:
        lines.append(f"  wrong rows: {_ranges(rows)}")
    lines.append(f"  wrong {'columns' if grid.shape[0] > 1 else 'indices'}: {_ranges(cols if grid.shape[0] > 1 else np.flatnonzero(mask[0]))}")
    lines += _periodic(mask)
    lines += _rearrangements(grid, want, rtol, atol)
    if matmul is not None:
        lines += _k_steps(grid, *matmul)
    return "\n".join(lines)


# -- helpers ------------------------------------------------------------------

def _numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if str(x.dtype) not in ("torch.float32", "torch.float64") and x.is_floating_point():
            x = x.float()
    return np.asarray(x)


def _wrong(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float) -> np.ndarray:
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    with np.errstate(invalid="ignore"):
        close = np.abs(a - e) <= atol + rtol * np.abs(e)
    same = (a == e) | (np.isnan(a) & np.isnan(e))       # equal infinities, NaN where NaN is expected
    return ~(close | same)


def _ranges(indices: np.ndarray, limit: int = 8) -> str:
    """[0, 1, 2, 7, 9, 10] -> '0-2, 7, 9-10'; long lists are cut after `limit` ranges."""
    if len(indices) == 0:
        return "none"
    runs, start = [], indices[0]
    for prev, cur in zip(indices, list(indices[1:]) + [None]):
        if cur is None or cur != prev + 1:
            runs.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = cur
    more = f", ... ({len(runs) - limit} more ranges)" if len(runs) > limit else ""
    return ", ".join(runs[:limit]) + more


def _periodic(mask: np.ndarray) -> list[str]:
    """The smallest period (power of two up to 256) along rows or columns where every wrong element falls
    in the same residues, e.g. 'columns: only c % 32 in {0} wrong' (one lane of every warp)."""
    lines = []
    for axis, label in ((1, "column"), (0, "row")):
        hits = np.flatnonzero(mask.any(axis=1 - axis))
        extent = mask.shape[axis]
        if len(hits) in (0, extent) or extent < 4:
            continue
        for period in (2, 4, 8, 16, 32, 64, 128, 256):
            if period >= extent:
                break
            residues = np.unique(hits % period)
            if len(residues) < period and np.all(np.isin(np.arange(extent) % period, residues) == np.isin(
                    np.arange(extent), hits)):
                lines.append(f"  every {label} i with i % {period} in {_ranges(residues)} is wrong, no other")
                break
    return lines


def _rearrangements(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float) -> list[str]:
    """Transposes, whole-row / whole-column permutations and shifts that turn `expected` into `actual`."""
    lines = []
    if actual.shape[0] == actual.shape[1] and actual.shape[0] > 1 and not _wrong(actual, expected.T, rtol, atol).any():
        lines.append("  pattern: the output is the reference transposed")
    for axis, label in ((0, "row"), (1, "column")):
        mapping = _matching_slices(actual, expected, axis, rtol, atol)
        if mapping is None:
            continue
        moved = {i: j for i, j in mapping.items() if i != j}
        if not moved:
            continue
        shifts = {j - i for i, j in moved.items()}
        if len(shifts) == 1:
            lines.append(f"  pattern: {len(moved)} {label}s hold the reference's {label} {shifts.pop():+d} from "
                         f"them (a shifted tile or an off-by-one block index)")
        else:
            sample = ", ".join(f"{i}<-{j}" for i, j in list(moved.items())[:8])
            lines.append(f"  pattern: {label}s permuted ({len(moved)} moved; got<-want: {sample})")
    return lines


def _matching_slices(actual, expected, axis, rtol, atol) -> dict | None:
    """For every wrong slice along `axis`, the index of a reference slice equal to it, or None if some
    wrong slice matches no reference slice (then it is not a rearrangement)."""
    a, e = np.moveaxis(actual, axis, 0), np.moveaxis(expected, axis, 0)
    if a.shape[0] > 4096 or a.shape[0] < 2:
        return None
    mapping = {}
    for i in range(a.shape[0]):
        if not _wrong(a[i], e[i], rtol, atol).any():
            continue
        errors = np.nanmax(np.abs(e.astype(np.float64) - a[i].astype(np.float64)) - rtol * np.abs(e), axis=1)
        j = int(np.nanargmin(errors))
        if errors[j] > atol:
            return None
        mapping[i] = j
    return mapping or None


def _k_steps(actual: np.ndarray, a, b, block_k: int) -> list[str]:
    """Fit actual - a @ b to the partial products of each K-step: a coefficient near -1 is a step that was
    skipped, near +1 one counted twice (a stale pipeline slot read again), near 0 a step done right."""
    a, b = _numpy(a).astype(np.float64), _numpy(b).astype(np.float64)
    k = a.shape[1]
    steps = [slice(s, min(s + block_k, k)) for s in range(0, k, block_k)]
    if len(steps) > 64 or a.shape[0] * b.shape[1] > 1 << 22:
        return []
    error = (actual.astype(np.float64) - a @ b).ravel()
    partials = np.stack([(a[:, s] @ b[s, :]).ravel() for s in steps], axis=1)
    coef, *_ = np.linalg.lstsq(partials, error, rcond=None)
    residual = np.linalg.norm(partials @ coef - error) / max(np.linalg.norm(error), 1e-30)
    if residual > 0.1:
        return [f"  K-steps: the error is not a combination of per-step products (residual {residual:.2f})"]
    skipped = [i for i, c in enumerate(coef) if abs(c + 1) < 0.1]
    doubled = [i for i, c in enumerate(coef) if abs(c - 1) < 0.1]
    return [f"  K-steps of {block_k}: skipped {skipped or 'none'}, counted twice {doubled or 'none'}, "
            f"coefficients {np.round(coef, 2).tolist()}"]
