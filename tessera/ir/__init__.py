"""Tessera's typed tile IR: data types, types, ops, builder, verifier, text form.

This package imports nothing else of tessera; everything else builds on it.
"""
