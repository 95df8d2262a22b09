"""User functions fused into the attention forward kernel: `score_mod` (FlexAttention's) and an output epilogue.

    @tessera.func
    def alibi(score, slopes, h, q_idx, kv_idx):
        return score + tessera.load(slopes + h) * (kv_idx - q_idx).to(tessera.f32)

    o, lse = attention(q, k, v, causal=True, score_mod=alibi, score_mod_args=(slopes,))

`score_mod(score, *operands)` gets the BM x BN float32 scores in natural
units (scale * q.k, softcapped first when `softcap` is set) and returns new
ones; the masks (causal, window, the end of K) apply after it. Parameters
named `b`, `h` (scalars: the batch or varlen sequence, the query head),
`q_idx` (BM, 1) and `kv_idx` (1, BN) (positions within the sequence,
clamped into range, so loads through them stay in bounds) receive those.
Tensor operands arrive as pointers for the function to index (up to two),
numbers as scalars (up to two).

`epilogue(o, *operands)` gets the BM x D float32 normalized output tile and
returns the tile to store (in q's dtype); it may take one tensor shaped
like O (its matching tile arrives, in float32), one number, and `b`, `h`,
`q_idx`. LSE is the unmodified softmax's of the modified scores.

The fused functions run in the forward kernel only: there is no backward
through them, so inputs that require gradients are refused.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

from .hooks import blamed_on, call_error, hook_params

OP = "tessera::attention"
SCORE_INDEX = ("b", "h", "q_idx", "kv_idx")
EPILOGUE_INDEX = ("b", "h", "q_idx")


@dataclass
class AttentionHooks:
    """The kernel's hook slots, filled: score_mod's two pointers and two scalars, the epilogue's O-shaped tensor
    and scalar, and each function's argument order into (its slots..., its index values...)."""

    score_mod: Any = None
    epilogue: Any = None
    pointers: list[torch.Tensor] = field(default_factory=list)
    mod_scalars: list[Any] = field(default_factory=list)
    ep_tensor: Optional[torch.Tensor] = None
    ep_scalar: Any = 0.0
    sm_order: tuple[int, ...] = ()
    ep_order: tuple[int, ...] = ()

    def args(self, o: torch.Tensor, strides) -> tuple:
        """The kernel's hook parameters (unused pointers stand in as o; `strides` maps a tensor to its
        (batch, seq, head, dim) strides)."""
        pointers = self.pointers + [o] * (2 - len(self.pointers))
        scalars = self.mod_scalars + [0.0] * (2 - len(self.mod_scalars))
        ep = self.ep_tensor if self.ep_tensor is not None else o
        ep_strides = strides(ep) if self.ep_tensor is not None else (0, 0, 0, 0)
        return (*pointers, *scalars, ep, *ep_strides, self.ep_scalar)

    def constexprs(self) -> dict:
        return dict(SCORE_MOD=self.score_mod, SM_ORDER=self.sm_order, EPILOGUE=self.epilogue,
                    EP_ORDER=self.ep_order, EP_TILE=self.ep_tensor is not None)

    def blame(self):
        """Errors at library lines while tracing these functions, re-raised at the user's function."""
        return blamed_on(OP, {role: fn for role, fn in (("score_mod", self.score_mod), ("epilogue", self.epilogue))
                              if fn is not None})


NO_HOOKS = AttentionHooks()


def attention_hooks(q: torch.Tensor, score_mod, score_mod_args: Sequence[Any], epilogue,
                    epilogue_args: Sequence[Any]) -> AttentionHooks:
    """Check the user's functions and operands and place them in the kernel's slots."""
    hooks = AttentionHooks(score_mod=score_mod, epilogue=epilogue)
    if score_mod is None and score_mod_args:
        raise call_error(OP, "score_mod_args are given without a score_mod function; pass score_mod=fn")
    if epilogue is None and epilogue_args:
        raise call_error(OP, "epilogue_args are given without an epilogue function; pass epilogue=fn")
    if score_mod is not None:
        params = hook_params(OP, "score_mod", score_mod, SCORE_INDEX, len(score_mod_args))
        slots = {}
        for name, value in zip(params.operands, score_mod_args):
            if isinstance(value, torch.Tensor):
                _same_device(name, value, q)
                hooks.pointers.append(value.contiguous())
                slots[name] = len(hooks.pointers) - 1
            else:
                hooks.mod_scalars.append(_number("score_mod", name, value))
                slots[name] = 2 + len(hooks.mod_scalars) - 1
        if len(hooks.pointers) > 2 or len(hooks.mod_scalars) > 2:
            raise call_error(OP, "score_mod takes at most two tensor and two scalar operands; stack tensors "
                                 "together or fold scalars")
        hooks.sm_order = tuple(slots[n] if n in slots else 4 + SCORE_INDEX.index(n) for n in params.names)
    if epilogue is not None:
        hooks.ep_order = _epilogue_order(hooks, q, epilogue, epilogue_args)
    if torch.is_grad_enabled() and any(x.requires_grad for x in [q, *hooks.pointers]):
        raise call_error(OP, "score_mod and epilogue run in the forward kernel only (no backward through them "
                             "yet); call under torch.no_grad() or detach the inputs")
    return hooks


def _epilogue_order(hooks: AttentionHooks, q: torch.Tensor, epilogue, epilogue_args) -> tuple[int, ...]:
    params = hook_params(OP, "epilogue", epilogue, EPILOGUE_INDEX, len(epilogue_args))
    slots = {}
    for name, value in zip(params.operands, epilogue_args):
        if isinstance(value, torch.Tensor) and hooks.ep_tensor is None:
            _same_device(name, value, q)
            if value.shape != q.shape:
                raise call_error(OP, f"epilogue operand '{name}' has shape {tuple(value.shape)}; tensors the "
                                     f"attention epilogue takes are shaped like the output {tuple(q.shape)}")
            hooks.ep_tensor, slots[name] = value, 0
        elif not isinstance(value, torch.Tensor) and name not in slots and 1 not in slots.values():
            hooks.ep_scalar, slots[name] = _number("epilogue", name, value), 1
        else:
            raise call_error(OP, "the attention epilogue takes at most one tensor (shaped like the output) and "
                                 "one number")
    return tuple(slots[n] if n in slots else 2 + EPILOGUE_INDEX.index(n) for n in params.names)


def _same_device(name: str, value: torch.Tensor, q: torch.Tensor) -> None:
    if value.device != q.device:
        raise call_error(OP, f"operand '{name}' is on {value.device} but q is on {q.device}; move it")


def _number(role: str, name: str, value: Any):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise call_error(OP, f"{role} operand '{name}' is {type(value).__name__} {value!r:.40}; operands are "
                             f"tensors or Python numbers")
    return float(value) if isinstance(value, float) else int(value)
