"""`tessera.torch.op`: a Python function that launches Tessera kernels, as a PyTorch op.

    import tessera.torch

    @tessera.torch.op("mylib::scaled_add", mutates_args=())
    def scaled_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
        out = torch.empty_like(x)
        scaled_add_kernel[(tessera.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), alpha, BLOCK=1024)
        return out

    torch.library.opcheck(scaled_add, (x, y, 2.0))
    torch.compile(model, fullgraph=True)        # the op stays in the graph

The function becomes a `torch.library.custom_op` (type annotations give its
schema; `mutates_args` names the tensors it writes in place). Its fake
implementation, which torch.compile and `opcheck` run on fake tensors to learn
the output's shape, dtype and device, is the function itself with every
Tessera launch skipped (`fast_launch.launches_skipped`): what it allocates and
returns is already right, so most ops need no fake of their own; pass `fake=`
when the function reads tensor data on the host. `backward=` (and
`setup_context=`) register autograd as `register_autograd` does.

A raw `kernel[grid](...)` inside torch.compile is not traced: it is called
outside the graph (a graph break, or under `fullgraph=True` an error that
says to use this decorator).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable

import torch

from .dsl.fast_launch import launches_skipped

__all__ = ["op"]


def op(name: str, *, mutates_args: Iterable[str] | str = (), fake: Callable | None = None,
       backward: Callable | None = None, setup_context: Callable | None = None,
       device_types: str | Iterable[str] | None = None, schema: str | None = None) -> Callable[[Callable], Any]:
    """Decorate a function launching Tessera kernels to make it the PyTorch op `name` ("namespace::name")."""
    if "::" not in name:
        raise ValueError(f"tessera.torch.op needs a qualified name like 'mylib::{name}' (namespace::op), got {name!r}")
    if setup_context is not None and backward is None:
        raise ValueError(f"tessera.torch.op({name!r}): setup_context= is given without backward=; pass both")

    def decorate(fn: Callable) -> Any:
        custom = torch.library.custom_op(name, fn, mutates_args=mutates_args, device_types=device_types,
                                         schema=schema)
        custom.register_fake(fake if fake is not None else _without_launches(fn))
        if backward is not None:
            custom.register_autograd(backward, setup_context=setup_context)
        return custom
    return decorate


def _without_launches(fn: Callable) -> Callable:
    """`fn` with its Tessera launches skipped: the fake implementation of the op."""
    @functools.wraps(fn)
    def fake(*args, **kwargs):
        with launches_skipped():
            return fn(*args, **kwargs)
    return fake
