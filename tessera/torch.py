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

Dispatching a custom op costs about 9 µs of Python before the function runs.
Where nothing would see the dispatch (`unobserved(*tensors)`: plain CUDA
tensors, no gradient to record, no torch.compile, tracing, vmap or torch
function / dispatch mode), a public wrapper may call the function directly,
as the dispatcher would, which the kernel library does on every op:

    fn = _scaled_add if tessera.torch.unobserved(x, y) else scaled_add
    return fn(x, y, alpha)
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable

import torch

from .dsl.fast_launch import launches_skipped

__all__ = ["op", "unobserved"]


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


def unobserved(*tensors: torch.Tensor | None) -> bool:
    """Whether dispatching a custom op on these tensors (None: an absent optional one) would only call its CUDA
    implementation: each is a plain CUDA tensor (or a Parameter) that needs no gradient recorded, and nothing
    watches the dispatch. Then calling the implementation directly does the same, without the dispatcher."""
    if not _nothing_watches():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and ((type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter) or not t.is_cuda
                              or (grad and t.requires_grad)):
            return False
    return True


def _nothing_watches() -> bool:
    """No torch.compile, JIT tracing, vmap/grad transform, or torch function / dispatch mode is active."""
    C = torch._C
    return not (torch.compiler.is_compiling() or C._is_torch_function_mode_enabled()
                or C._len_torch_dispatch_stack() or C._are_functorch_transforms_active() or C._get_tracing_state())
