"""Build modes a user switches on in the environment or per call, read in one place.

    strict  TESSERA_STRICT=1 / strict=True: a `tessera.pipeline` that gets less than it asked for is a
            CompileError instead of a PipelineWarning
    debug   TESSERA_DEBUG=1 / debug=True: device-side print and assert are compiled into GPU code
            (part of the binary cache key, since the code differs)
"""

from __future__ import annotations

import os

STRICT_ENV = "TESSERA_STRICT"
DEBUG_ENV = "TESSERA_DEBUG"


def strict_mode(strict: bool | None = None) -> bool:
    """`strict`, or when None whether $TESSERA_STRICT is set (to anything but "", "0", "false" or "no")."""
    return _flag(strict, STRICT_ENV)


def debug_mode(debug: bool | None = None) -> bool:
    """`debug`, or when None whether $TESSERA_DEBUG is set."""
    return _flag(debug, DEBUG_ENV)


def _flag(value: bool | None, env: str) -> bool:
    if value is not None:
        return value
    return os.environ.get(env, "").strip().lower() not in ("", "0", "false", "no")
