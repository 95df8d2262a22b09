"""Mistakes with explicit shared memory are CompileErrors naming the kernel, the line and the fix."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import tessera
from tessera.dsl.errors import CompileError, ConstexprError, LoopCarriedTypeError, TypeMismatchError

X = np.zeros((64, 64), np.float16)


def compile_error(kernel, *args, cls=CompileError, target=None, **constexprs) -> CompileError:
    with pytest.raises(CompileError) as info:
        if target is None:
            kernel.specialize(*args, **constexprs)
        else:
            kernel.compile(*args, target=target, **constexprs)
    error = info.value
    assert isinstance(error, cls), f"{type(error).__name__}: {error}"
    assert error.kernel == kernel.name
    return error


def line_of(kernel, text: str) -> int:
    lines, first = inspect.getsourcelines(kernel.fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def check(kernel, at: str, *fragments: str, cls=CompileError, args=(X,), target=None, **constexprs):
    error = compile_error(kernel, *args, cls=cls, target=target, **constexprs)
    assert error.line == line_of(kernel, at), str(error)
    for fragment in fragments:
        assert fragment in error.message, error.message
    return error


@tessera.kernel
def copy_whole_buffer(x_ptr):
    x = tessera.view(x_ptr, (64, 64))
    buf = tessera.shared((2, 64, 32), tessera.f16)
    tessera.async_copy(buf, x.block((64, 32), (0, 0)))


def test_copying_a_block_into_a_buffer_of_another_shape_suggests_the_slot():
    check(copy_whole_buffer, "tessera.async_copy(", "shapes differ", "index a slot of the buffer (buf[s]",
          cls=TypeMismatchError)


@tessera.kernel
def copy_wrong_shape(x_ptr):
    x = tessera.view(x_ptr, (64, 64))
    buf = tessera.shared((2, 64, 32), tessera.f16)
    tessera.async_copy(buf[0], x.block((32, 32), (0, 0)))


def test_copying_a_block_of_another_shape_names_both():
    check(copy_wrong_shape, "tessera.async_copy(", "(32, 32)", "smem<64x32xf16>", "copy a block of shape (64, 32)",
          cls=TypeMismatchError)


@tessera.kernel
def copy_wrong_dtype(x_ptr):
    x = tessera.view(x_ptr, (64, 64))
    buf = tessera.shared((64, 64), tessera.f32)
    tessera.async_copy(buf, x.block((64, 64)))


def test_a_copy_converts_nothing_so_dtypes_must_match():
    check(copy_wrong_dtype, "tessera.async_copy(", "the dtypes must match", "tessera.shared((64, 64), tessera.f16)",
          cls=TypeMismatchError)


@tessera.kernel
def copy_from_tile(x_ptr):
    buf = tessera.shared((64,), tessera.f16)
    values = tessera.load(x_ptr + tessera.arange(0, 64))
    tessera.async_copy(buf, values)


@tessera.kernel
def copy_from_view(x_ptr):
    x = tessera.view(x_ptr, (64, 64))
    buf = tessera.shared((64, 64), tessera.f16)
    tessera.async_copy(buf, x)


def test_copying_from_something_that_is_not_a_view_block_or_pointer_tile():
    check(copy_from_tile, "tessera.async_copy(", "from a view block (v.block(shape, index)) or a tile of pointers",
          "tile<64xf16>", cls=TypeMismatchError)
    check(copy_from_view, "tessera.async_copy(", "name a block of the view", cls=TypeMismatchError)


@tessera.kernel
def copy_block_with_mask(x_ptr):
    x = tessera.view(x_ptr, (64, 64))
    buf = tessera.shared((64, 64), tessera.f16)
    tessera.async_copy(buf, x.block((64, 64)), mask=True)


def test_a_view_block_copy_takes_no_mask():
    check(copy_block_with_mask, "tessera.async_copy(", "takes no mask")


@tessera.kernel
def copy_into_tile(x_ptr):
    x = tessera.view(x_ptr, (64, 64))
    tessera.async_copy(tessera.zeros((64, 64), dtype=tessera.f16), x.block((64, 64)))


def test_the_destination_must_be_a_shared_buffer():
    check(copy_into_tile, "tessera.async_copy(", "must be a shared buffer", cls=TypeMismatchError)


@tessera.kernel
def huge_buffer(x_ptr):
    tessera.shared((4, 256, 256), tessera.f32)


def test_a_buffer_larger_than_any_gpu_is_an_error_at_trace_time():
    check(huge_buffer, "tessera.shared(", "1048576 bytes", "use smaller tiles or fewer slots")


@tessera.kernel
def big_buffer(x_ptr, out_ptr):
    buf = tessera.shared((2, 128, 128), tessera.f32)
    buf[0].store(tessera.zeros((128, 128), dtype=tessera.f32))
    offs = tessera.arange(0, 128)
    tessera.store(out_ptr + offs[:, None] * 128 + offs[None, :], buf[0].load())


def test_a_buffer_larger_than_the_targets_shared_memory_is_an_error_when_compiling_for_it():
    args = (X, np.zeros((128, 128), np.float32))
    check(big_buffer, "tessera.shared(", "131072 bytes", "65536 bytes of shared memory a block has on gfx942",
          args=args, target="gfx942")


@tessera.kernel
def shared_in_loop(x_ptr):
    for i in range(0, 4):
        tessera.shared((64,), tessera.f16)


def test_shared_inside_a_loop_asks_to_allocate_at_the_top_level():
    check(shared_in_loop, "tessera.shared(", "inside a loop or branch", "allocate it once at the top level")


@tessera.kernel
def subbyte_buffer(x_ptr):
    tessera.shared((64,), tessera.u4)


def test_sub_byte_elements_are_refused():
    check(subbyte_buffer, "tessera.shared(", "at least one byte", "as u8", cls=TypeMismatchError)


@tessera.kernel
def slot_out_of_range(x_ptr):
    buf = tessera.shared((2, 64), tessera.f16)
    buf[2].store(0)


@tessera.kernel
def slot_of_flat_buffer(x_ptr):
    buf = tessera.shared((64,), tessera.f16)
    buf[0].store(0)


def test_slots_are_checked():
    check(slot_out_of_range, "buf[2]", "slot 2 of smem<2x64xf16>, which has 2 slots")
    check(slot_of_flat_buffer, "buf[0]", "has one dim, so it has no slots")


@tessera.kernel
def traced_wait(x_ptr, n):
    tessera.async_wait(n)


@tessera.kernel
def negative_wait(x_ptr):
    tessera.async_wait(-1)


def test_async_wait_counts_groups_at_compile_time():
    check(traced_wait, "tessera.async_wait(", "must be known at compile time", cls=ConstexprError, args=(X, 3))
    check(negative_wait, "tessera.async_wait(", ">= 0")


@tessera.kernel
def store_wrong_shape(x_ptr):
    buf = tessera.shared((2, 64), tessera.f16)
    buf[0].store(tessera.zeros((32,), dtype=tessera.f16))


def test_a_store_of_another_shape_is_an_error():
    check(store_wrong_shape, ".store(", "does not broadcast to the shape (64,)", cls=TypeMismatchError)


@tessera.kernel
def carried_slot(x_ptr):
    buf = tessera.shared((2, 64), tessera.f16)
    cur = buf[0]
    for i in range(0, 4):
        cur.store(0)
        cur = buf[1]


@tessera.kernel
def slot_by_branch(x_ptr, n):
    buf = tessera.shared((2, 64), tessera.f16)
    cur = buf[0]
    if n > 0:
        cur = buf[1]
    cur.store(0)


def test_a_buffer_cannot_be_carried_or_chosen_at_run_time_so_the_slot_number_is():
    check(carried_slot, "for i in range(0, 4):", "cannot be carried", "carry the slot number instead",
          cls=LoopCarriedTypeError)
    check(slot_by_branch, "if n > 0:", "cannot depend on a runtime condition", "pick the slot number",
          cls=LoopCarriedTypeError, args=(X, 3))
