"""Tessera's typed IR (tile and thread level): data types, types, ops and their traits, layouts,
builder, verifier, text form. It imports nothing else of tessera; everything else builds on it.

This package imports nothing else of tessera; everything else builds on it.
"""
