"""User functions the fusion tests compile into the library kernels (kernels are read from files)."""

import importlib.util
import math
import sys
from pathlib import Path

import tessera

SQRT_HALF = 1.0 / math.sqrt(2.0)


@tessera.func
def bias_gelu_residual(acc, bias, residual):
    x = acc + bias
    return 0.5 * x * (1.0 + tessera.erf(x * SQRT_HALF)) + residual


@tessera.func
def scaled_rows_plus_scalar(acc, row_scale, scalar, column_scale):
    return acc * row_scale * column_scale + scalar


@tessera.func
def relu_and_pre(acc, bias):
    pre = acc + bias
    return tessera.maximum(pre, 0.0), pre


@tessera.func
def dropout(acc, seed, p, n_cols, rows, cols):
    keep = tessera.rand(seed, rows * n_cols + cols) > p
    return tessera.where(keep, acc / (1.0 - p), 0.0)


@tessera.func
def dequantize_int8(codes, scale):
    """int8 codes times a per-column (of op(b)) scale, in float16."""
    return (codes.to(tessera.f32) * scale).to(tessera.f16)


@tessera.func
def scale_a_rows(a, scale):
    return (a.to(tessera.f32) * scale).to(a.dtype)


@tessera.func
def one_too_many(acc, bias, residual):
    return acc + bias + residual


@tessera.func
def wrong_shape_inside(acc, bias):
    return acc + tessera.zeros((4, 8), tessera.f32) + bias


@tessera.func
def returns_a_row(acc):
    return tessera.sum(acc, axis=0)


@tessera.func
def score_alibi(score, slopes, h, q_idx, kv_idx):
    """ALiBi: a per-head slope times the key's distance behind the query."""
    return score + tessera.load(slopes + h) * (kv_idx - q_idx).to(tessera.f32)


@tessera.func
def score_softcap(score, cap):
    return cap * tessera.tanh(score / cap)


@tessera.func
def document_mask(score, docs, q_idx, kv_idx):
    """Queries see only keys of their own document (docs: the document id of each position)."""
    same = tessera.load(docs + q_idx) == tessera.load(docs + kv_idx)
    return tessera.where(same, score, -float("inf"))


@tessera.func
def output_times_gate(o, gate):
    return o * gate


def _bench_fusion():
    """bench/fusion.py as a module (under its own name: `fusion` is also a test folder here), with bench/ on the
    path for its `gpu_common`."""
    bench = Path(__file__).resolve().parents[2] / "bench"
    if str(bench) not in sys.path:
        sys.path.append(str(bench))
    spec = importlib.util.spec_from_file_location("bench_fusion", bench / "fusion.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# bench/fusion.py's epilogue (c): dropout(gelu_tanh(acc + bias) + residual), Philox on the element index; the
# tests compile and check the benchmark's own function, not a copy of it.
bias_gelu_tanh_residual_dropout = _bench_fusion().bias_gelu_residual_dropout


@tessera.func
def residual_dropout_and_pre(acc, bias, residual, seed, p, n_cols, rows, cols):
    """dropout(acc + bias + residual), and the pre-dropout sum as a second output."""
    pre = acc + bias + residual
    keep = tessera.rand(seed, rows * n_cols + cols) > p
    return tessera.where(keep, pre / (1.0 - p), 0.0), pre
