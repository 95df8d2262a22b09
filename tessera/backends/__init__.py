"""What runs or compiles IR: the tile interpreter (`interp`), the SIMT simulator (`simt`), the
target-neutral LLVM core (`llvm`) and the NVIDIA and AMD backends built on it (`nvptx`, `amdgpu`). Each
may import `tessera.ir` and the backend it builds on (simt on interp, nvptx and amdgpu on llvm), never
passes, runtime or dsl.
"""
