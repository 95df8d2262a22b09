"""Hints (`multiple_of`, `max_contiguous`, `assume`) have done their work by now: the alignment analysis
read them before layouts and vector widths were chosen. A value hint becomes its operand; `assume` goes."""

from __future__ import annotations

from . import lowering


@lowering("multiple_of", "max_contiguous")
def _value_hint(ctx, op):
    ctx.define(op.result, ctx.operand(op, 0), op)


@lowering("assume")
def _assume(ctx, op):
    pass
