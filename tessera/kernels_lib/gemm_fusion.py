"""`gemm(a, b, epilogue=fn, epilogue_args=(...))` and prologues: the host side of `gemm_fused.py`.

    @tessera.func
    def bias_gelu_residual(acc, bias, residual):
        x = acc + bias
        return 0.5 * x * (1.0 + tessera.erf(x * 0.7071067811865476)) + residual

    y = gemm(x, w, epilogue=bias_gelu_residual, epilogue_args=(bias, residual))

Operands broadcast like numpy against the hook's matrix: the epilogue's is
the M x N output (bias (N,), per-row scale (M, 1), residual (M, N), a 0-d
tensor or a Python number); prologue_a's the M x K op(a), prologue_b's the
K x N op(b). A hook may also take `rows` / `cols` (the global row and
column indices of its tile, int32 (R, 1) and (1, C)), e.g. for dropout's
random offsets. An epilogue returning a tuple stores its extra tiles in
`epilogue_outputs` (M x N tensors). `gather_a` (int32 or int64 (M,)) makes
output row m read row gather_a[m] of op(a). The result is a new M x N
tensor in out_dtype (default: a's dtype).

This path calls the kernel directly rather than through a torch custom op
(a schema cannot carry a Python function). Autograd: with
`epilogue_reference=` (a torch function computing what the epilogue
computes), or an epilogue from `epilogues.py` (which carry theirs), the
result differentiates through it (`gemm_fusion_grad.py`); without one,
inputs that require gradients are an error naming the fix.
On the GPU the fused kernel is compiled with fast math (fma contraction,
approximate exp2 and division) where every output is float16 / bfloat16
(`fast_math_allows`), as the plain op does for its own epilogue.
torch.compile breaks the graph at the call (`gemm` is
`torch.compiler.disable`d on this path) and runs it eagerly; under
`fullgraph=True` that break is torch's error naming this reason.
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

import tessera

from .gemm import TORCH_DTYPES, CPU_CONFIG, CPU_NUM_SMS, _check, _grid, _host, _num_sms, _strided, launch_tuned
from .epilogues import reference_of
from .gemm_alignment import operand_alignment, pointers_aligned
from .gemm_fused import gemm_fused_kernel, gemm_fused_kernel_fast
from .gemm_fusion_grad import differentiable, needs_grad, refuse_unsupported
from .hooks import (
    TensorOperand, blamed_on, call_error, hook_params, matrix_operand,
)

OP = "tessera::gemm"
MAX_TENSORS, MAX_SCALARS, MAX_OUTPUTS = 6, 4, 2
INDEX_NAMES = ("rows", "cols")
HOOK_ARGUMENTS = ("epilogue", "epilogue_args", "epilogue_outputs", "epilogue_reference", "prologue_a",
                  "prologue_a_args", "prologue_b", "prologue_b_args", "gather_a")
INDEX_SLOTS = {"rows": MAX_TENSORS + MAX_SCALARS, "cols": MAX_TENSORS + MAX_SCALARS + 1}


@dataclass
class Slots:
    """The kernel's operand slots as the hooks fill them: tensors (with their role), scalars, and each hook's
    argument order into (tensors, scalars, rows, cols)."""

    tensors: list[tuple[str, TensorOperand]] = field(default_factory=list)
    scalars: list[Any] = field(default_factory=list)
    orders: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def add(self, role: str, fn: Any, args: Sequence[Any], rows: int, cols: int, device: torch.device) -> None:
        """Place hook `fn`'s operands (for a rows x cols matrix) and record its argument order."""
        params = hook_params(OP, role, fn, INDEX_NAMES, len(args))
        by_name = {}
        for name, value in zip(params.operands, args):
            if isinstance(value, torch.Tensor):
                self.tensors.append((role, matrix_operand(OP, role, name, value, rows, cols, device)))
                by_name[name] = len(self.tensors) - 1
            elif isinstance(value, numbers.Number) and not isinstance(value, complex):
                self.scalars.append(value)
                by_name[name] = MAX_TENSORS + len(self.scalars) - 1
            else:
                raise call_error(OP, f"{role} operand '{name}' is {type(value).__name__} {value!r:.40}; operands "
                                     f"are tensors or Python numbers")
        if len(self.tensors) > MAX_TENSORS or len(self.scalars) > MAX_SCALARS:
            raise call_error(OP, f"the hooks take {len(self.tensors)} tensor and {len(self.scalars)} scalar "
                                 f"operands; the fused GEMM has room for {MAX_TENSORS} and {MAX_SCALARS}: fold some "
                                 f"together (stack row vectors, pre-multiply scalars)")
        self.orders[role] = tuple(by_name[n] if n in by_name else INDEX_SLOTS[n] for n in params.names)


def fused_gemm(a: torch.Tensor, b: torch.Tensor, *, epilogue=None, epilogue_args: Sequence[Any] = (),
               epilogue_outputs: Sequence[torch.Tensor] = (), epilogue_reference=None, prologue_a=None,
               prologue_a_args: Sequence[Any] = (),
               prologue_b=None, prologue_b_args: Sequence[Any] = (), gather_a: Optional[torch.Tensor] = None,
               out_dtype: Optional[torch.dtype] = None, trans_a: bool = False, trans_b: bool = False) -> torch.Tensor:
    """epilogue(prologue_a(op(a)[gather_a]) @ prologue_b(op(b)), *epilogue_args): see the module docstring."""
    M_a, N, K, out_dtype = _check_operands(a, b, prologue_a, prologue_b, out_dtype, trans_a, trans_b)
    M = _gathered_rows(gather_a, a) if gather_a is not None else M_a
    slots = Slots()
    hooks = {}
    for role, fn, args, rows, cols in (("epilogue", epilogue, epilogue_args, M, N),
                                       ("prologue_a", prologue_a, prologue_a_args, M, K),
                                       ("prologue_b", prologue_b, prologue_b_args, K, N)):
        if fn is not None:
            slots.add(role, fn, tuple(args), rows, cols, a.device)
            hooks[role] = fn
        elif args:
            raise call_error(OP, f"{role}_args are given without a {role} function; pass {role}=fn")
    outputs = _check_outputs(epilogue, epilogue_outputs, M, N, a.device)
    if epilogue_reference is not None and epilogue is None:
        raise call_error(OP, "epilogue_reference is given without the epilogue it stands for; pass epilogue=fn")
    if needs_grad(a, b, *epilogue_args, *prologue_a_args, *prologue_b_args):
        epilogue_reference = epilogue_reference or reference_of(epilogue)
        refuse_unsupported(epilogue_reference, prologue_a is not None or prologue_b is not None,
                           gather_a is not None, bool(outputs))
        names = hook_params(OP, "epilogue", epilogue, INDEX_NAMES, len(epilogue_args)).names
        args = tuple(x.detach() if isinstance(x, torch.Tensor) else x for x in epilogue_args)
        run = lambda: fused_gemm(a.detach(), b.detach(), epilogue=epilogue, epilogue_args=args,  # noqa: E731
                                 out_dtype=out_dtype, trans_a=trans_a, trans_b=trans_b)
        return differentiable(run, epilogue_reference, names, tuple(epilogue_args), a, b, trans_a, trans_b)
    c = torch.empty((M, N), dtype=out_dtype, device=a.device)
    if M == 0 or N == 0:
        return c
    with blamed_on(OP, hooks):
        _launch(a, b, c, M, N, K, trans_a, trans_b, slots, outputs, gather_a, hooks)
    return c


def _check_operands(a, b, prologue_a, prologue_b, out_dtype, trans_a, trans_b) -> tuple[int, int, int, Any]:
    """M, N, K and the output dtype. An operand a prologue reads may have any dtype the prologue converts (int8
    codes, say); the library GEMM's rules hold otherwise, and the kernel's `dot` checks at compile time that
    what the prologues return agrees."""
    if prologue_a is None and prologue_b is None:
        return _check(a, b, None, None, out_dtype, trans_a, trans_b)
    for name, x in (("a", a), ("b", b)):
        if x.dim() != 2:
            raise ValueError(f"{OP}: {name} must be a 2-D matrix, got shape {tuple(x.shape)}")
    if a.device != b.device:
        raise ValueError(f"{OP}: a is on {a.device} but b is on {b.device}")
    M, K = (a.shape[1], a.shape[0]) if trans_a else tuple(a.shape)
    K_b, N = (b.shape[1], b.shape[0]) if trans_b else tuple(b.shape)
    if K != K_b:
        raise ValueError(f"{OP}: shape mismatch: op(a) is {M}x{K} but op(b) is {K_b}x{N}; inner sizes differ")
    floats = [x.dtype for x in (a, b) if x.dtype in TORCH_DTYPES]
    out_dtype = out_dtype or (floats[0] if floats else torch.float32)
    if out_dtype not in TORCH_DTYPES:
        raise ValueError(f"{OP}: out_dtype {out_dtype} is not supported; use float16, bfloat16 or float32")
    return M, N, K, out_dtype


def _gathered_rows(gather_a: torch.Tensor, a: torch.Tensor) -> int:
    if gather_a.dim() != 1 or gather_a.dtype not in (torch.int32, torch.int64):
        raise call_error(OP, f"gather_a must be a 1-D int32 or int64 tensor of row indices, got "
                             f"{gather_a.dtype} {tuple(gather_a.shape)}")
    if gather_a.device != a.device:
        raise call_error(OP, f"gather_a is on {gather_a.device} but a is on {a.device}")
    return gather_a.shape[0]


def _check_outputs(epilogue, outputs: Sequence[torch.Tensor], M: int, N: int, device) -> tuple:
    if outputs and epilogue is None:
        raise call_error(OP, "epilogue_outputs are given without an epilogue to compute them")
    if len(outputs) > MAX_OUTPUTS:
        raise call_error(OP, f"{len(outputs)} epilogue_outputs; the fused GEMM stores at most {MAX_OUTPUTS}")
    for i, y in enumerate(outputs):
        if not isinstance(y, torch.Tensor) or tuple(y.shape) != (M, N) or y.device != device:
            shown = f"{y.dtype} {tuple(y.shape)} on {y.device}" if isinstance(y, torch.Tensor) else repr(y)
            raise call_error(OP, f"epilogue_outputs[{i}] must be a ({M}, {N}) tensor on {device}, got {shown}")
    return tuple(outputs)


def _launch(a, b, c, M, N, K, trans_a, trans_b, slots: Slots, outputs, gather_a, hooks) -> None:
    """Fill the kernel's slots (unused ones point at c, with zero strides) and launch it."""
    a_mem, stride_am, stride_ak = _strided(a.t() if trans_a else a)
    b_mem, stride_bk, stride_bn = _strided(b.t() if trans_b else b)
    tensors = [op.tensor for _, op in slots.tensors] + [c] * (MAX_TENSORS - len(slots.tensors))
    strides = [s for _, op in slots.tensors for s in (op.stride_r, op.stride_c)]
    strides += [0] * (2 * MAX_TENSORS - len(strides))
    scalars = list(slots.scalars) + [0] * (MAX_SCALARS - len(slots.scalars))
    ys = list(outputs) + [c] * (MAX_OUTPUTS - len(outputs))
    y_strides = [s for y in ys for s in y.stride()]
    args = (a_mem, b_mem, c, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, *c.stride(), *tensors, *strides,
            *scalars, *ys, *y_strides, gather_a if gather_a is not None else c)
    specs = tuple((role, op.full_r, op.full_c) for role, op in slots.tensors)
    constexprs = dict(EPILOGUE=hooks.get("epilogue"), EP_ORDER=slots.orders.get("epilogue", ()),
                      PROLOGUE_A=hooks.get("prologue_a"), PA_ORDER=slots.orders.get("prologue_a", ()),
                      PROLOGUE_B=hooks.get("prologue_b"), PB_ORDER=slots.orders.get("prologue_b", ()),
                      SPECS=specs + (None,) * (MAX_TENSORS - len(specs)), N_OUT=len(outputs),
                      GATHER_A=gather_a is not None)
    # what the sizes and strides are multiples of, and whether the rows allow a pipelined K loop (a prologue's
    # operands may differ in width: int8 codes beside float16)
    align, pipelined = operand_alignment(M, N, K, (stride_am, stride_ak, stride_bk, stride_bn), a.element_size(),
                                         pointers_aligned(a_mem, b_mem), b.element_size())
    constexprs.update(ALIGN=align, PIPELINED=pipelined)
    if a.device.type == "cpu" or os.environ.get("TESSERA_INTERPRET", "0") == "1":
        host_args = tuple(_host(x) if isinstance(x, torch.Tensor) else x for x in args)
        grid = _grid(M, N, CPU_CONFIG.kwargs, CPU_NUM_SMS)
        with tessera.writes_whole(c):       # for tessera.fusion(): every tile of C is stored
            gemm_fused_kernel.kernel[grid](*host_args, **constexprs, **CPU_CONFIG.as_dict())
    else:
        capturing = tessera.capturing()
        kernel = gemm_fused_kernel_fast if fast_math_allows(c, outputs) and not capturing else gemm_fused_kernel
        launch_tuned(kernel, args, c, M, N, _num_sms(a.get_device()), capturing, **constexprs)


def fast_math_allows(c: torch.Tensor, outputs: Sequence[torch.Tensor]) -> bool:
    """Whether the fused GEMM may run compiled with fast math (`gemm_fused_kernel_fast`): every tile it stores
    is float16 / bfloat16, whose rounding (2^-11 / 2^-8) hides the approximations (about 2^-22 relative) and
    contractions, as the plain op's `_fast_math_allows` decides for its own epilogue."""
    return all(y.dtype in (torch.float16, torch.bfloat16) for y in (c, *outputs))
