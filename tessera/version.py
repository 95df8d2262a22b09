"""Tessera's version, written once (pyproject.toml repeats it for packaging); this module imports nothing, so any
part of tessera may read it (the runtime's cache key does) without importing the package above it."""

__version__ = "0.1.0"
