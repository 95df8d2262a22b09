"""Ahead-of-time C launchers: a compiled kernel as C code that loads and launches it with no Python.
It reads `tessera compile` manifests and may import `ir`, `runtime` and `version`.

`tessera compile` writes, beside the binary and its JSON manifest, a C header and source
with the binary embedded and one launch function per kernel (`c_launcher.py`);
`tessera link` joins several specializations of one kernel into one launch function
that picks the most specialized variant the arguments allow (`c_dispatcher.py`). The
generated code calls the CUDA driver API (HIP's module API for AMD targets) and nothing
else.
"""

from .c_dispatcher import c_dispatcher
from .c_launcher import CSources, c_launcher
from .manifest import AotError, Parameter, Specialization

__all__ = ["AotError", "CSources", "Parameter", "Specialization", "c_dispatcher", "c_launcher"]
