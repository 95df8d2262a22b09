"""The Python frontend: `@tessera.kernel`, tracing a kernel's AST into tile IR (`tracer.py`),
specialization, errors, launches, and the compile driver (`compiler.py`: tile passes -> thread passes ->
a backend, keeping every stage). It ties the others together, so it may import ir, passes, backends,
runtime and version, but never kernels_lib.
"""
