"""The one function of a thread- or tile-IR module written as text, parsed and verified: how the backend and
simulator tests state the kernel they run (`kernel(text)`)."""

from tessera.ir.parser import parse_module
from tessera.ir.verifier import verify_module


def kernel(text: str):
    """The first function of the module `text`, after the verifier has accepted the module."""
    module = parse_module(text)
    verify_module(module)
    return module.functions[0]
