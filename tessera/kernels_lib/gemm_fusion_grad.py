"""Gradients of `gemm(a, b, epilogue=fn, ...)`, through a torch reference of the epilogue.

The fused kernel cannot be differentiated (its epilogue is tile IR compiled
into it), so a GEMM with a fused epilogue records autograd only through a
torch reference: `epilogue_reference=`, or the known one of an epilogue
from `epilogues.py`. A reference computes what the epilogue computes and
is called like it (the float32 accumulator, the operands in the
epilogue's order, and `rows` / `cols` as int32 (M, 1) / (1, N) index
tensors where the epilogue takes them). The forward is the fused
kernel; the backward recomputes the float32 accumulator op(a) @ op(b) with
torch, differentiates the reference at it (torch.autograd.grad, which also
reduces broadcast operands such as a bias to their shape) and turns the
accumulator's gradient into a's and b's with two matrix products.

Without a reference, and for prologues, `gather_a` and `epilogue_outputs`
(whose backward is not built), an input that requires a gradient is an
error naming the fix, never a silently missing gradient.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from .hooks import call_error

OP = "tessera::gemm"


def needs_grad(*values: Any) -> bool:
    """Whether autograd would record through a tensor among `values` (grad mode on, one requires grad)."""
    return torch.is_grad_enabled() and any(isinstance(v, torch.Tensor) and v.requires_grad for v in values)


def refuse_unsupported(reference, prologues: bool, gather: bool, outputs: bool) -> None:
    """Raise, naming the fix, when a gradient is required through what has no backward here."""
    fix = "call it under torch.no_grad(), or detach the inputs"
    if prologues or gather:
        what = "prologue_a / prologue_b" if prologues else "gather_a"
        raise call_error(OP, f"{what} has no backward: the inputs require gradients, but the fused GEMM can "
                             f"differentiate only an epilogue; {fix}, or apply the prologue with torch ops first")
    if outputs:
        raise call_error(OP, f"epilogue_outputs have no backward: the inputs require gradients; {fix}")
    if reference is None:
        raise call_error(OP, "the inputs require gradients, and the fused epilogue (tile IR in the kernel) cannot "
                             "be differentiated by itself: pass epilogue_reference=fn, a torch function computing "
                             "the same as the epilogue from the float32 accumulator and the same operands (or use "
                             f"an epilogue of tessera.kernels_lib.epilogues, which carry theirs), or {fix}")
    if not callable(reference):
        raise call_error(OP, f"epilogue_reference must be a torch function, got {type(reference).__name__}")


def differentiable(run: Callable[[], torch.Tensor], reference: Callable, names: Sequence[str],
                   args: Sequence[Any], a: torch.Tensor, b: torch.Tensor, trans_a: bool,
                   trans_b: bool) -> torch.Tensor:
    """`run()` (the fused GEMM) as an autograd node whose backward differentiates `reference`; `names` are the
    epilogue's parameters after the accumulator, `args` its operands in order."""
    tensors = [x for x in args if isinstance(x, torch.Tensor)]
    return _FusedGemm.apply(run, reference, tuple(names), tuple(args), trans_a, trans_b, a, b, *tensors)


class _FusedGemm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run, reference, names, args, trans_a, trans_b, a, b, *tensors):
        ctx.reference, ctx.names, ctx.args, ctx.trans = reference, names, args, (trans_a, trans_b)
        ctx.save_for_backward(a, b, *tensors)
        return run()

    @staticmethod
    def backward(ctx, grad):
        a, b, *tensors = ctx.saved_tensors
        trans_a, trans_b = ctx.trans
        op_a = (a.t() if trans_a else a).float()
        op_b = (b.t() if trans_b else b).float()
        acc = (op_a @ op_b).requires_grad_(True)
        M, N = acc.shape
        saved = iter(tensors)
        leaves, operands = [], iter(ctx.args)
        with torch.enable_grad():
            call = []
            for name in ctx.names:
                if name == "rows":
                    call.append(torch.arange(M, dtype=torch.int32, device=acc.device)[:, None])
                elif name == "cols":
                    call.append(torch.arange(N, dtype=torch.int32, device=acc.device)[None, :])
                else:
                    value = next(operands)
                    if isinstance(value, torch.Tensor):
                        value = next(saved)
                        if value.dtype.is_floating_point:
                            value = value.detach().float().requires_grad_(ctx.needs_input_grad[8 + len(leaves)])
                        leaves.append(value)
                    call.append(value)
            out = ctx.reference(acc, *call)
            wanted = [acc] + [x for x in leaves if x.requires_grad]
            grads = iter(torch.autograd.grad(out, wanted, grad.float(), allow_unused=True))
        g_acc = next(grads)
        grad_a = grad_b = None
        if g_acc is not None and ctx.needs_input_grad[6]:
            grad_op_a = g_acc @ op_b.t()
            grad_a = (grad_op_a.t() if trans_a else grad_op_a).to(a.dtype)
        if g_acc is not None and ctx.needs_input_grad[7]:
            grad_op_b = op_a.t() @ g_acc
            grad_b = (grad_op_b.t() if trans_b else grad_op_b).to(b.dtype)
        grad_tensors = []
        for leaf, original in zip(leaves, tensors):
            g = next(grads) if leaf.requires_grad else None
            grad_tensors.append(None if g is None else g.to(original.dtype))
        return (None, None, None, None, None, None, grad_a, grad_b, *grad_tensors)
