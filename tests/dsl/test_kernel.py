"""The kernel object: binding, specialization, caching and CPU launches."""

import sys

import numpy as np
import pytest

import tessera
from tessera.ir import dtypes as dt


@tessera.kernel
def scale(x_ptr, out_ptr, n, factor, BLOCK: tessera.constexpr):
    offs = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    mask = offs < n
    tessera.store(out_ptr + offs, tessera.load(x_ptr + offs, mask=mask) * factor, mask=mask)


@tessera.kernel(do_not_specialize=["n"])
def copy_any_n(x_ptr, out_ptr, n, BLOCK: tessera.constexpr):
    offs = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    tessera.store(out_ptr + offs, tessera.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def test_launch_with_grid_subscript_and_keyword_agree():
    x = np.arange(100, dtype=np.float32)
    a, b = np.zeros_like(x), np.zeros_like(x)
    scale[(4,)](x, a, 100, 2.0, BLOCK=32)
    scale(x, b, 100, 2.0, BLOCK=32, grid=(4,))
    np.testing.assert_array_equal(a, 2 * x)
    np.testing.assert_array_equal(a, b)


def test_grid_may_be_a_function_of_the_arguments():
    x = np.arange(70, dtype=np.float32)
    out = np.zeros_like(x)
    scale[lambda meta: (tessera.cdiv(meta["n"], meta["BLOCK"]),)](x, out, 70, 3.0, BLOCK=16)
    np.testing.assert_array_equal(out, 3 * x)


def test_one_trace_per_specialization():
    scale.specializations.clear()
    x32, out32 = np.ones(64, np.float32), np.zeros(64, np.float32)
    scale[(1,)](x32, out32, 64, 2.0, BLOCK=64)
    scale[(1,)](x32, out32, 64, 5.0, BLOCK=64)        # same key: runtime value only
    assert len(scale.specializations) == 1
    scale[(1,)](x32, out32, 64, 2.0, BLOCK=32)        # constexpr value
    scale[(2,)](x32, out32, 63, 2.0, BLOCK=32)        # n no longer divisible by 16
    scale[(2,)](x32, out32, 1, 2.0, BLOCK=32)         # n == 1
    x64, out64 = np.ones(64, np.float64), np.zeros(64, np.float64)
    scale[(1,)](x64, out64, 64, 2.0, BLOCK=64)        # dtype
    assert len(scale.specializations) == 5


def test_specialization_records_alignment_and_divisibility():
    x, out = np.zeros(64, np.float32), np.zeros(64, np.float32)
    fn = scale.specialize(x, out, 64, 1.0, BLOCK=64).function
    assert fn.attrs["divisible_by_16"] == (0, 1, 2)   # both pointers aligned, n % 16 == 0
    misaligned = np.zeros(65, np.float32)[1:]
    fn = scale.specialize(misaligned, out, 63, 1.0, BLOCK=64).function
    assert fn.attrs["divisible_by_16"] == (1,)


def test_do_not_specialize_keeps_only_the_dtype():
    copy_any_n.specializations.clear()
    x, out = np.ones(64, np.float32), np.zeros(64, np.float32)
    for n in (64, 63, 1, 17):
        copy_any_n[(1,)](x, out, n, BLOCK=64)
    assert len(copy_any_n.specializations) == 1


def test_int_equal_to_one_is_traced_as_the_constant():
    ir = scale.ir(np.ones(4, np.float32), np.zeros(4, np.float32), 1, 1.0, BLOCK=4)
    # n is bound to 1 while tracing, so the mask compares against a constant
    assert "value = 1}" in ir


def test_ir_text_is_available_per_specialization():
    ir = scale.ir(np.ones(4, np.float32), np.zeros(4, np.float32), 4, 1.0, BLOCK=4)
    assert ir.startswith("func @scale(%x_ptr: ptr<f32>, %out_ptr: ptr<f32>, %n: i32, %factor: f32)")
    assert "store" in ir


def test_python_scalars_get_default_types():
    big = 2**40
    fn = scale.specialize(np.ones(4, np.float32), np.zeros(4, np.float32), big, 1.0, BLOCK=4).function
    assert [str(a.type) for a in fn.args] == ["ptr<f32>", "ptr<f32>", "i64", "f32"]


def test_reinterpret_passes_bf16_storage():
    values = np.array([1.5, -2.0, 3.25, 0.0], dtype=np.float32)
    bits = dt.bf16.encode(values).astype(np.uint16)
    out = np.zeros(4, np.float32)

    @tessera.kernel
    def widen(x_ptr, out_ptr):
        offs = tessera.arange(0, 4)
        tessera.store(out_ptr + offs, tessera.load(x_ptr + offs).to(tessera.f32))

    widen[(1,)](tessera.reinterpret(bits, tessera.bf16), out)
    np.testing.assert_array_equal(out, values)


def test_reinterpret_rejects_storage_of_the_wrong_width():
    with pytest.raises(TypeError, match="cannot view float32 elements"):
        tessera.reinterpret(np.zeros(4, np.float32), tessera.bf16)


@pytest.mark.parametrize("call, message", [
    (lambda x: scale[(1,)](x, x, 4, BLOCK=4), "missing a required argument: 'factor'"),
    (lambda x: scale[(1,)](x, x, 4, 1.0, 7, BLOCK=4), "multiple values for argument 'BLOCK'"),
    (lambda x: scale[(1,)](x, x, 4, 1.0, BLOCK=4, WIDTH=2), "unexpected keyword argument 'WIDTH'"),
    (lambda x: scale[(1,)](x, [1, 2], 4, 1.0, BLOCK=4), "argument 'out_ptr' of type list cannot be passed"),
    (lambda x: scale[(1,)](x, x, 4, 1.0, BLOCK=[4]), "constexpr parameter 'BLOCK' got list"),
    (lambda x: scale[(1,)](x, x.astype(np.complex64), 4, 1.0, BLOCK=4), "numpy dtype complex64"),
    (lambda x: scale(x, x, 4, 1.0, BLOCK=4), "launch kernel 'scale' with a grid"),
    (lambda x: scale[(0.5,)](x, x, 4, 1.0, BLOCK=4), "grid must be 1 to 3 non-negative ints"),
    (lambda x: scale[(1, 1, 1, 1)](x, x, 4, 1.0, BLOCK=4), "grid must be 1 to 3 non-negative ints"),
])
def test_bad_launches_raise_kernel_argument_errors(call, message):
    with pytest.raises(tessera.KernelArgumentError, match=message) as info:
        call(np.zeros(4, np.float32))
    assert "kernel 'scale'" in str(info.value)


def test_an_empty_grid_runs_nothing():
    out = np.full(4, 7.0, np.float32)
    scale[(0,)](np.ones(4, np.float32), out, 4, 2.0, BLOCK=4)
    assert (out == 7.0).all()


def test_compile_errors_name_the_kernel_and_line():
    @tessera.kernel
    def broken(x_ptr):
        tessera.store(x_ptr, undefined_name)  # noqa: F821

    with pytest.raises(tessera.UnknownNameError) as info:
        broken[(1,)](np.zeros(1, np.float32))
    message = str(info.value)
    assert "kernel 'broken'" in message and "test_kernel.py" in message
    assert "tessera.store(x_ptr, undefined_name)" in message


def test_out_of_bounds_pointer_access_is_reported_not_performed():
    x = np.zeros(8, np.float32)

    @tessera.kernel
    def overrun(x_ptr):
        offs = tessera.arange(0, 16)
        tessera.store(x_ptr + offs, tessera.full((16,), 1.0))

    with pytest.raises(tessera.InterpreterError, match="out of bounds|outside"):
        overrun[(1,)](x)


def test_print_inside_a_kernel_prints_on_the_cpu(capsys):
    @tessera.kernel
    def show(x_ptr):
        v = tessera.load(x_ptr + tessera.arange(0, 4))
        print("values", v)

    show[(1,)](np.array([1, 2, 3, 4], np.int32))
    assert "values" in capsys.readouterr().out


def test_breakpoint_exposes_kernel_variables(monkeypatch):
    seen = {}

    def hook(*args, **kwargs):
        frame = sys._getframe(1)
        seen.update(frame.f_locals)

    monkeypatch.setattr(sys, "breakpointhook", hook)

    @tessera.kernel
    def inspect_me(x_ptr):
        v = tessera.load(x_ptr + tessera.arange(0, 4))
        doubled = v * 2
        breakpoint()
        tessera.store(x_ptr + tessera.arange(0, 4), doubled)

    inspect_me[(1,)](np.array([1, 2, 3, 4], np.int32))
    assert seen["doubled"].tolist() == [2, 4, 6, 8]


def test_error_columns_point_into_the_file_for_nested_kernels():
    @tessera.kernel
    def nested(x_ptr):
        tessera.store(x_ptr, missing)  # noqa: F821

    with pytest.raises(tessera.UnknownNameError) as info:
        nested[(1,)](np.zeros(1, np.float32))
    error = info.value
    assert error.source_line[error.column:].startswith("missing")


def test_overlapping_array_arguments_are_not_promised_noalias():
    x, y = np.ones(64, np.float32), np.ones(64, np.float32)
    separate = scale.specialize(x, y, 64, 1.0, BLOCK=64).function
    in_place = scale.specialize(x, x, 64, 1.0, BLOCK=64).function
    overlapping_view = scale.specialize(x[:48], x[16:], 48, 1.0, BLOCK=64).function
    assert separate.attrs["noalias"] == (0, 1)
    assert "noalias" not in in_place.attrs and "noalias" not in overlapping_view.attrs


def test_noalias_reaches_the_llvm_parameters():
    x = np.ones(64, np.float32)
    in_place = scale.compile(x, x, 64, 1.0, BLOCK=64, target="sm_80").stages["llvm_ir"]
    separate = scale.compile(x, np.ones(64, np.float32), 64, 1.0, BLOCK=64, target="sm_80").stages["llvm_ir"]
    assert "noalias" not in in_place.split("define")[1].split("{")[0]
    assert separate.split("define")[1].split("{")[0].count("noalias") == 2
