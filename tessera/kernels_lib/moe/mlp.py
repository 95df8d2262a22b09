"""The expert MLP steps as torch ops: permute, gate_up, down, combine, and `experts`, which runs them all.

Each op launches one kernel of `experts.py` over the aligned rows of
`align` (sorted_ids, block_expert, offsets, padded to block_m rows) and has
a fake implementation, so torch.compile traces a layer built of them. CPU
tensors run on the tile interpreter with small tiles (`plan.CPU_PLAN`);
GPU tensors with their plan target's plan whose BM is block_m (`plan.gpu_plans`).
"""

from __future__ import annotations

from typing import Optional

import torch

import tessera
import tessera.torch

from . import plan as plans
from ..gemm_alignment import pointers_aligned, rows_alignment
from ..targets import plan_target
from .align import align
from .common import FLOAT_DTYPES, check_device, kernel_arg
from .experts import ACTIVATIONS, combine_kernel, down_kernel, gate_up_kernel, permute_kernel

PERMUTE_COLUMNS = 128   # columns of x one permute program copies
COMBINE_TOKENS = 16


def tiles(block_m: int, t: torch.Tensor, quantized: bool = False, fp8: bool = False) -> plans.Plan:
    """The plan for aligned blocks of `block_m` rows of tensors like `t` (see `plan.py`): bf16 weights,
    `quantized` ones, or `fp8` activations and weights."""
    if t.device.type == "cpu":
        return plans.Plan(block_m, plans.CPU_PLAN.gate_up, plans.CPU_PLAN.down)
    weights = "fp8" if fp8 else "quantized" if quantized else "bf16"
    for shipped in plans.gpu_plans(plan_target(t.device), weights).values():
        if shipped.BM == block_m:
            return shipped if t.dtype != torch.float32 else shipped.without_pipelining()
    raise ValueError(f"tessera::moe: no GPU plan aligns to block_m = {block_m}; use one of "
                     f"{sorted(p.BM for p in plans.SHIPPED.values())} (plan.plan(...).BM)")


def pipelining(t: plans.GemmTiles, sizes: tuple[int, ...], element_bits: int, *tensors) -> dict:
    """A grouped GEMM's STAGES and ALIGN (`gemm_alignment.rows_alignment`): its operands are dense rows of
    `sizes` (H and I, or N and K) elements of at least `element_bits`; ALIGN states what each size is a multiple
    of, which the specialization misses for bf16 rows of 8 * odd elements (H = 4104), and the K loop keeps the
    plan's pipeline only where every row and pointer among `tensors` starts 16-byte aligned (else a plain loop,
    not copies the compiler would refuse)."""
    align, pipelined = rows_alignment(sizes, element_bits, pointers_aligned(*tensors))
    return dict(STAGES=t.stages if pipelined else 1, ALIGN=align)


def interleave_gate_up(w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    """[E, I, H] gate and up weights -> the [E, 2I, H] layout the gate_up kernel reads: gate row i at row 2i,
    up row i at row 2i + 1."""
    if w_gate.shape != w_up.shape or w_gate.dim() != 3:
        raise ValueError(f"interleave_gate_up: gate and up weights must both be [E, I, H], got "
                         f"{tuple(w_gate.shape)} and {tuple(w_up.shape)}")
    E, I, H = w_gate.shape
    return torch.stack((w_gate, w_up), 2).reshape(E, 2 * I, H)


def _check_rows(name: str, sorted_ids, block_expert, offsets, block_m: int) -> None:
    if sorted_ids.dtype != torch.int32 or block_expert.dtype != torch.int32 or offsets.dtype != torch.int32:
        raise ValueError(f"tessera::{name}: sorted_ids, block_expert and offsets are align's int32 outputs")
    if block_expert.shape[0] != tessera.cdiv(sorted_ids.shape[0], block_m):
        raise ValueError(f"tessera::{name}: block_expert has {block_expert.shape[0]} blocks but sorted_ids has "
                         f"{sorted_ids.shape[0]} rows; align with the same block_m ({block_m})")


def _permute(x: torch.Tensor, sorted_ids: torch.Tensor, top_k: int, block_m: int) -> torch.Tensor:
    """xs[r] = x[sorted_ids[r] // top_k]: the token rows in the aligned order, zeros on padding rows (block_m:
    rows per program)."""
    rows, (T, H) = sorted_ids.shape[0], x.shape
    xs = torch.empty((rows, H), dtype=x.dtype, device=x.device)
    grid = (tessera.cdiv(rows, block_m), tessera.cdiv(H, PERMUTE_COLUMNS))
    permute_kernel[grid](*(kernel_arg(t) for t in (x.contiguous(), sorted_ids, xs)), rows, H, T * top_k,
                         TOP_K=top_k, BR=block_m, BH=PERMUTE_COLUMNS)
    return xs


permute = torch.library.custom_op("tessera::moe_permute", _permute, mutates_args=())


@permute.register_fake
def _permute_fake(x, sorted_ids, top_k, block_m):
    return x.new_empty((sorted_ids.shape[0], x.shape[1]))


def _gate_up(xs: torch.Tensor, w13: torch.Tensor, block_expert: torch.Tensor, offsets: torch.Tensor,
             activation: str, block_m: int) -> torch.Tensor:
    """h[r] = act(xs[r] @ Wg[e]^T) * (xs[r] @ Wu[e]^T) for the aligned rows (w13: `interleave_gate_up`)."""
    rows, H = xs.shape
    E, two_i, _ = w13.shape
    h = torch.empty((rows, two_i // 2), dtype=xs.dtype, device=xs.device)
    t = tiles(block_m, xs).gate_up
    grid = (tessera.cdiv(rows, block_m), tessera.cdiv(two_i // 2, t.BN))
    w13 = w13.contiguous()
    gate_up_kernel[grid](*(kernel_arg(a) for a in (xs, w13, h, block_expert, offsets)), rows, H,
                         two_i // 2, E, E * two_i, ACTIVATION=activation, BM=block_m, BN=t.BN, BK=t.BK,
                         **pipelining(t, (H, two_i // 2), xs.element_size() * 8, xs, w13), num_warps=t.num_warps)
    return h


gate_up = torch.library.custom_op("tessera::moe_gate_up", _gate_up, mutates_args=())


@gate_up.register_fake
def _gate_up_fake(xs, w13, block_expert, offsets, activation, block_m):
    return xs.new_empty((xs.shape[0], w13.shape[1] // 2))


def _down(h: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, sorted_ids: torch.Tensor,
          block_expert: torch.Tensor, offsets: torch.Tensor, block_m: int, atomic: bool) -> torch.Tensor:
    """weight[pair] * (h[r] @ W2[e]^T): each pair's row of y [T * top_k, H] (h's dtype), or with `atomic`
    the top-k sum itself, added into a float32 [T, H]."""
    rows, I = h.shape
    E, H, _ = w2.shape
    T, K = weights.shape
    out = torch.zeros((T, H), dtype=torch.float32, device=h.device) if atomic else \
        torch.empty((T * K, H), dtype=h.dtype, device=h.device)
    t = tiles(block_m, h).down
    grid = (tessera.cdiv(rows, block_m), tessera.cdiv(H, t.BN))
    args = (h, w2.contiguous(), out, weights.contiguous().float(), sorted_ids, block_expert, offsets)
    down_kernel[grid](*(kernel_arg(a) for a in args), rows, H, I, E, E * H, T * K, TOP_K=K, ATOMIC=atomic,
                      BM=block_m, BN=t.BN, BK=t.BK, **pipelining(t, (H, I), h.element_size() * 8, *args[:2]),
                      num_warps=t.num_warps)
    return out


down = torch.library.custom_op("tessera::moe_down", _down, mutates_args=())


@down.register_fake
def _down_fake(h, w2, weights, sorted_ids, block_expert, offsets, block_m, atomic):
    T, K = weights.shape
    if atomic:
        return h.new_empty((T, w2.shape[1]), dtype=torch.float32)
    return h.new_empty((T * K, w2.shape[1]))


def _combine(y: torch.Tensor, top_k: int, out_dtype: torch.dtype) -> torch.Tensor:
    """out[t] = sum over j of y[t * top_k + j] (float32 sums, in slot order), in out_dtype."""
    T, H = y.shape[0] // top_k, y.shape[1]
    out = torch.empty((T, H), dtype=out_dtype, device=y.device)
    grid = (tessera.cdiv(T, COMBINE_TOKENS), tessera.cdiv(H, PERMUTE_COLUMNS))
    combine_kernel[grid](kernel_arg(y.contiguous()), kernel_arg(out), T, H, TOP_K=top_k,
                         K_PAD=tessera.next_power_of_2(top_k), BT=COMBINE_TOKENS, BH=PERMUTE_COLUMNS)
    return out


combine = torch.library.custom_op("tessera::moe_combine", _combine, mutates_args=())


@combine.register_fake
def _combine_fake(y, top_k, out_dtype):
    return y.new_empty((y.shape[0] // top_k, y.shape[1]), dtype=out_dtype)


def check_experts(x, w13, w2, weights, ids, activation) -> None:
    """The shapes and dtypes `experts` needs, or a ValueError naming the fix."""
    if x.dim() != 2 or x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"tessera::moe: x must be a float16/bfloat16/float32 [tokens, hidden] matrix, got "
                         f"{x.dtype} {tuple(x.shape)}")
    T, H = x.shape
    if w13.dim() != 3 or w13.shape[2] != H or w13.shape[1] % 2:
        raise ValueError(f"tessera::moe: w13 must be [experts, 2 * intermediate, {H}] (interleave_gate_up), got "
                         f"{tuple(w13.shape)}")
    E, I = w13.shape[0], w13.shape[1] // 2
    if tuple(w2.shape) != (E, H, I):
        raise ValueError(f"tessera::moe: w2 must be [experts, hidden, intermediate] = [{E}, {H}, {I}], got "
                         f"{tuple(w2.shape)}")
    if w13.dtype != x.dtype or w2.dtype != x.dtype:
        raise ValueError(f"tessera::moe: x, w13 and w2 must share a dtype, got {x.dtype}, {w13.dtype}, {w2.dtype}; "
                         f"cast the weights with .to({x.dtype})")
    if ids.dim() != 2 or ids.shape[0] != T or tuple(weights.shape) != tuple(ids.shape):
        raise ValueError(f"tessera::moe: weights and ids must both be [{T}, top_k] (route's), got "
                         f"{tuple(weights.shape)} and {tuple(ids.shape)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"tessera::moe: activation must be one of {ACTIVATIONS}, got {activation!r}")
    check_device("moe", x, w13=w13, w2=w2, weights=weights, ids=ids)


def experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, *,
            activation: str = "silu", atomic: bool = False, counts: Optional[torch.Tensor] = None,
            chunk_counts: Optional[torch.Tensor] = None, block_m: Optional[int] = None,
            fp8_activations: bool = False, one_launch: bool = False) -> torch.Tensor:
    """sum over j of weights[t, j] * down_e(act(gate_e(x_t)) * up_e(x_t)), e = ids[t, j]: the routed experts.

    x is [T, H]; w13 [E, 2I, H] (`interleave_gate_up` of the gate and up
    weights), w2 [E, H, I], all one float dtype; weights and ids [T, top_k]
    (`route`'s; `counts` and `chunk_counts` too, to save a counting launch).
    activation is "silu" or "gelu" (tanh approximation). The top-k sum is
    deterministic (each pair's row, then a sum in slot order), or with
    `atomic` added with atomics into float32. Differentiable in x, w13, w2
    and weights (`autograd.py`). block_m: the row tile (default: `plan.plan`).

    w13 and w2 may instead both be `quantized.QuantizedExperts` (int4 or
    fp8, `quantize_experts`; w13 from `quantized.interleave`): the GEMMs
    then dequantize the weights in registers (`quantized_mlp.py`),
    differentiable in x and weights with the quantized weights frozen
    (`quantized_autograd.py`). With fp8 weights, `fp8_activations` also
    quantizes x and h per token and group of 128 (DeepSeek-V3's W8A8,
    `fp8_mlp.py`; sm_89+ and gfx950; inference only).

    `one_launch=True` runs counting, alignment and the four steps in one
    persistent kernel (`persistent.py`; bf16/f16/f32 weights, inference
    only), with the same result as the deterministic multi-kernel path.
    """
    if one_launch:
        from .quantized import QuantizedExperts
        from .persistent import experts_one_launch
        if isinstance(w13, QuantizedExperts) or isinstance(w2, QuantizedExperts) or fp8_activations:
            raise ValueError("tessera::moe: one_launch=True takes float16/bfloat16/float32 expert weights; "
                             "quantized experts run with one_launch=False")
        return experts_one_launch(x, w13, w2, weights, ids, activation=activation, atomic=atomic, block_m=block_m)
    from .quantized import QuantizedExperts
    quantized = isinstance(w13, QuantizedExperts) or isinstance(w2, QuantizedExperts)
    if quantized:
        from .fp8_mlp import forward_fp8
        from .quantized_autograd import experts_quant
        from .quantized_mlp import check_quantized
        check_quantized(x, w13, w2, weights, differentiable=not fp8_activations)
        run = forward_fp8 if fp8_activations else experts_quant
    elif fp8_activations:
        raise ValueError("tessera::moe: fp8_activations needs fp8 expert weights: quantize_experts(w, 'fp8')")
    else:
        from .autograd import experts_op
        check_experts(x, w13, w2, weights, ids, activation)
        run = forward if tessera.torch.unobserved(x, w13, w2, weights, ids) else experts_op
    T, K = ids.shape
    if T == 0:
        return x.new_zeros((0, w2.shape[1]))
    if block_m is None:
        block_m = plans.CPU_PLAN.BM if x.device.type == "cpu" else plans.plan(T, K, w13.shape[0]).BM
    sorted_ids, block_expert, offsets = align(ids, w13.shape[0], block_m, counts, chunk_counts)
    return run(x, w13, w2, weights, sorted_ids, block_expert, offsets, block_m, activation, atomic)


def forward(x, w13, w2, weights, sorted_ids, block_expert, offsets, block_m: int, activation: str,
            atomic: bool) -> torch.Tensor:
    """The four launches of `experts` after alignment: each op called directly where nothing observes its
    dispatch (`tessera.torch.unobserved`), as at decode, where the dispatcher's Python would show."""
    K = weights.shape[1]
    _check_rows("moe", sorted_ids, block_expert, offsets, block_m)
    direct = tessera.torch.unobserved(x, w13, w2, weights, sorted_ids, block_expert, offsets)
    permute_, gate_up_, down_, combine_ = (_permute, _gate_up, _down, _combine) if direct else \
        (permute, gate_up, down, combine)
    xs = permute_(x, sorted_ids, K, block_m)
    h = gate_up_(xs, w13, block_expert, offsets, activation, block_m)
    y = down_(h, w2, weights, sorted_ids, block_expert, offsets, block_m, atomic)
    return y.to(x.dtype) if atomic else combine_(y, K, x.dtype)
