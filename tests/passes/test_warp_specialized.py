"""Warp-specialized pipelines (`tessera.pipeline(..., warp_specialize=True)`): the language, the thread IR, the errors.

Specification:

* `warp_specialize=True` traces to an IR `for {stages = S, warp_specialize = true}`
  that prints and parses back and runs like `range` in the tile interpreter;
  it must be a compile-time bool and needs stages >= 2 (CompileErrors at the
  user's line);
* lowered for sm_90, the kernel has one warpgroup more than `num_warps`
  (`num_threads`, as the launcher and autotuner read it); after the mbarrier
  setup, `if thread_id >= C` splits it: the producer branch holds the only
  tma_loads (one thread issues them, waiting on the empty barriers from the
  second round through the ring on) and ends in a named barrier of every
  thread; the consumer branch runs the loop (wait full, body, arrive empty)
  and the rest of the kernel, where every barrier is `named_barrier {id = 1,
  count = C}`; the split says where the branches meet (`producer_joins_at`,
  for the shared-memory allocator); the kernel's `return` follows it;
* setmaxnreg only on sm_90a, and only when it raises the consumers' budget
  (whole consumer warpgroups, at least two);
* directly in a loop over tiles (a persistent kernel) the producer walks the
  tiles too (`warp_specialized_tiles.py`; test_gemm_persistent_ws.py has
  the library GEMM's);
* CompileErrors naming the kernel, the line and the fix: no TMA on the
  target, the loop nested in an `if`, memory writes before the loop
  (the producer would run them; reads only the consumers need are moved into
  their branch: test_ws_consumer_prologue.py), a load TMA cannot fill.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera.backends.interp import run_function
from tessera.dsl.compiler import compile_tile_module
from tessera.ir.parser import parse_module
from tessera.ir.printer import print_module
from tessera.ir.verifier import verify_module
from tessera.passes.thread_passes import lower

from pipeline_kernels import F16_RESULT
from ws_pipeline_kernels import ws_matmul_case


def split_of(fn):
    """(ops before the producer / consumer `if`, producer branch, consumer branch, ops after it)."""
    top = fn.body.ops
    split = next(op for op in top if op.name == "if" and "tma_load" in walk_names(op.regions[0]))
    i = top.index(split)
    return top[:i], split.regions[0], split.regions[1], top[i + 1:]


def walk_names(block):
    return [op.name for top in block.ops for op in top.walk()]


# -- the language ------------------------------------------------------------------------


def test_warp_specialize_is_recorded_on_the_for_and_round_trips():
    text = print_module(ws_matmul_case(64, 64, 64, 64, 64, 64, 3).module)
    assert "{stages = 3, warp_specialize = true}" in text
    assert print_module(parse_module(text)) == text


def test_the_tile_interpreter_ignores_the_flag():
    case = ws_matmul_case(61, 37, 208, 64, 64, 64, 3, trans_b=True)
    args = case.make_args()
    run_function(case.module.functions[0], args, case.grid)
    np.testing.assert_allclose(args[2].astype(np.float32), case.expected().astype(np.float32), **F16_RESULT)
    assert list(tessera.pipeline(0, 5, 2, stages=2, warp_specialize=True)) == [0, 2, 4]   # outside kernels


@tessera.kernel
def flag_kernel(x_ptr, n, S: tessera.constexpr, WS: tessera.constexpr):
    total = 0.0
    for i in tessera.pipeline(0, n, stages=S, warp_specialize=WS):
        total += tessera.load(x_ptr + i)
    tessera.store(x_ptr, total)


@pytest.mark.parametrize("stages, flag, message", [
    (3, 1, r"warp_specialize=\.\.\.\) must be True or False, got 1"),
    (1, True, r"warp_specialize=True\) needs a ring of stages >= 2 slots; pass stages=2 or more"),
])
def test_the_flag_must_be_a_compile_time_bool_with_a_ring(stages, flag, message):
    with pytest.raises(tessera.CompileError, match=f"(?s)kernel 'flag_kernel'.*{message}") as info:
        flag_kernel.specialize(np.zeros(4, np.float32), 4, S=stages, WS=flag)
    assert info.value.line is not None


# -- the thread IR ---------------------------------------------------------------------------


@pytest.mark.parametrize("num_warps", [4, 8])
def test_a_producer_warpgroup_beside_the_consumer_warps(num_warps):
    stages, consumers = 3, 32 * num_warps
    fn = lower(ws_matmul_case(64, 64, 256, 64, 64, 64, stages).module, "sm_90", num_warps).functions[0]
    assert fn.attrs["num_threads"] == consumers + 128
    before, producer, consumer, after = split_of(fn)
    split = next(op for op in fn.body.ops if op.name == "if" and op.regions[0] is producer)
    assert condition(split) == ("ge", consumers)
    # the split yields nothing: the consumers' branch goes on with the rest of the kernel after the loop, from
    # the op where the branches have met on (the consumers' named barrier after invalidating the mbarriers)
    joined = split.attrs["producer_joins_at"]
    assert split.results == [] and names(after) == ["return"]
    assert consumer.ops[joined].name == "named_barrier" and consumer.ops[joined].attrs == {"id": 1, "count": consumers}
    protocol, rest = consumer.ops[:joined + 1], consumer.ops[joined + 1:]
    rest_names = [op.name for top in rest for op in top.walk()]
    assert "tma_load" not in rest_names and "barrier" not in rest_names and "view_store" not in rest_names
    assert {"stmatrix", "tma_store"} <= set(rest_names)        # C: into a swizzled tile, then one TMA store
    assert {str(op.attrs) for top in rest for op in top.walk() if op.name == "named_barrier"} <= {
        str({"id": 1, "count": consumers})}

    # before the split: both mbarrier rings initialized (full: count 1, empty: count C), then CTA-wide barriers
    inits = [op for top in before for op in top.walk() if op.name == "mbarrier_init"]
    assert [op.operands[1].owner.attrs["value"] for op in inits] == [1] * stages + [consumers] * stages
    assert "tma_load" not in [op.name for top in before for op in top.walk()]

    produced = walk_names(producer)
    assert produced.count("tma_load") == 2 and produced.count("mbarrier_wait") == 1
    assert "mbarrier_arrive_expect_tx" in produced and "ldmatrix" not in produced and "mma" not in produced
    assert producer.ops[-2].name == "named_barrier" and producer.ops[-2].attrs == {"id": 2, "count": consumers + 128}
    lead = next(op for op in producer.ops if op.name == "if")
    assert lead.operands[0].owner.attrs["pred"] == "eq" and lead.operands[0].owner.operands[1].owner.attrs[
        "value"] == consumers                                    # one thread, the producer's first, issues

    loop = next(op for op in consumer.ops if op.name == "for")
    body = [op.name for op in loop.regions[0].ops]
    assert body[:body.index("mbarrier_wait") + 1][-1] == "mbarrier_wait" and "mma" in body
    assert body.index("mbarrier_wait") < body.index("ldmatrix") < body.index("mma") < body.index("mbarrier_arrive")
    assert "barrier" not in body and "tma_load" not in body
    consumed = walk_names(consumer)
    assert "barrier" not in consumed and "tma_load" not in consumed
    named = [op.attrs for top in protocol for op in top.walk() if op.name == "named_barrier"]
    assert named == [{"id": 2, "count": consumers + 128}, {"id": 1, "count": consumers}]
    assert consumed.count("mbarrier_inval") == 2 * stages


def names(ops):
    return [op.name for op in ops]


def condition(if_op):
    """(predicate, constant) of an `if` whose condition is `cmp thread_id, constant`."""
    cmp = if_op.operands[0].owner
    return cmp.attrs["pred"], cmp.operands[1].owner.attrs["value"]


def test_the_thread_ir_verifies_prints_and_parses_back():
    module = lower(ws_matmul_case(61, 200, 272, 32, 128, 64, 3, trans_b=True).module, "sm_90a", 8)
    verify_module(module)
    text = print_module(module)
    assert "named_barrier {count = 256, id = 1}" in text and "named_barrier {count = 384, id = 2}" in text
    assert print_module(parse_module(text)) == text


@pytest.mark.parametrize("target, num_warps, block, regs", [
    ("sm_90", 8, (32, 128), None),              # no setmaxnreg before sm_90a
    ("sm_90a", 4, (32, 64), None),              # 256 threads: 255 registers each at entry already
    ("sm_90a", 2, (32, 64), None),              # 64 consumers are not a whole warpgroup
    ("sm_90a", 8, (32, 128), (40, 232)),        # 384 threads: 168 at entry; 40 * 128 + 232 * 256 <= 65536
])
def test_setmaxnreg_only_where_it_gives_the_consumers_more(target, num_warps, block, regs):
    case = ws_matmul_case(64, 128, 128, *block, 64, 3)
    fn = lower(case.module, target, num_warps).functions[0]
    _, producer, consumer, _ = split_of(fn)
    dec = [op.attrs["count"] for op in producer.ops if op.name == "setmaxnreg"]
    inc = [op.attrs["count"] for op in consumer.ops if op.name == "setmaxnreg"]
    assert (dec, inc) == (([regs[0]], [regs[1]]) if regs else ([], []))
    if regs:
        assert producer.ops[0].name == consumer.ops[0].name == "setmaxnreg"
        assert regs[0] * 128 + regs[1] * 32 * num_warps <= 65536


# -- what is refused -----------------------------------------------------------------------------


def compile_error(module, target="sm_90", num_warps=4):
    """What cannot be warp-specialized is a warning (the loop falls back), an error in strict mode."""
    with pytest.warns(tessera.PipelineWarning, match="no warp specialization"):
        compile_tile_module(module, target=target, num_warps=num_warps)
    with pytest.raises(tessera.CompileError) as info:
        compile_tile_module(module, target=target, num_warps=num_warps, strict=True)
    assert info.value.line is not None
    return str(info.value)


def test_a_target_without_tma_is_refused():
    message = compile_error(ws_matmul_case(64, 64, 64, 64, 64, 64, 2).module, "sm_80")
    assert "kernel 'ws_matmul'" in message and "warp_specialize=True needs TMA (sm_90, sm_90a), which sm_80 lacks" \
        in message and "drop warp_specialize=True" in message


def test_wgmma_consumers_read_tma_filled_slots_and_retire_before_releasing():
    """On sm_90a a 64-row dot runs on wgmma from the TMA-filled slots; each iteration leaves its wgmma group
    in flight (wait_group 1) and then the warpgroup's first thread releases the slot of the iteration before,
    whose group that wait retired (issue 19); the last group is waited for after the loop."""
    fn = lower(ws_matmul_case(64, 64, 64, 64, 64, 64, 2).module, "sm_90a", 4).functions[0]
    loop = next(op for op in fn.walk() if op.name == "for" and any(o.name == "wgmma" for o in op.walk()))
    body = loop.regions[0]
    order = [o.name for op in body.ops for o in op.walk() if o.name in ("mbarrier_wait", "wgmma_wait", "mbarrier_arrive")]
    assert order == ["mbarrier_wait", "wgmma_wait", "mbarrier_arrive"]
    assert [op.attrs["pending"] for op in body.ops if op.name == "wgmma_wait"] == [1]
    after = loop.parent.ops[loop.parent.ops.index(loop) + 1]
    assert after.name == "wgmma_wait" and after.attrs["pending"] == 0
    assert not any(op.name == "async_copy" for op in fn.walk())
    # the one proxy fence is the epilogue's: C's stmatrix writes made visible to its TMA store
    fences = [op for op in fn.walk() if op.name == "fence_proxy_async"]
    assert len(fences) == 1 and not any(op is fences[0] for op in loop.walk())


@tessera.kernel
def persistent_ws(a_ptr, b_ptr, c_ptr, M, N, K, BM: tessera.constexpr, BN: tessera.constexpr,
                  BK: tessera.constexpr):
    pid_n = tessera.program_id(0)
    a = tessera.view(a_ptr, (M, K))
    b = tessera.view(b_ptr, (K, N))
    c = tessera.view(c_ptr, (M, N))
    for pid_m in range(0, tessera.cdiv(M, BM)):
        acc = tessera.zeros((BM, BN), dtype=tessera.f32)
        for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=2, warp_specialize=True):
            acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
        c.block((BM, BN), (pid_m, pid_n)).store(acc.to(tessera.f16))


@tessera.kernel
def bias_first_ws(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K, BM: tessera.constexpr, BN: tessera.constexpr,
                  BK: tessera.constexpr):
    pid_m = tessera.program_id(0)
    pid_n = tessera.program_id(1)
    a = tessera.view(a_ptr, (M, K))
    b = tessera.view(b_ptr, (K, N))
    tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(tessera.zeros((BM, BN), tessera.f16))
    acc = tessera.view(bias_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).load()
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=2, warp_specialize=True):
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
    tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc.to(tessera.f16))


def bf16(*shape):
    return tessera.reinterpret(np.zeros(shape, np.uint16), tessera.bf16)


@pytest.mark.parametrize("target", ["sm_90", "sm_90a"])
def test_a_loop_in_a_loop_over_tiles_is_specialized_with_the_producer_walking_the_tiles(target):
    """Directly in a loop over tiles (a persistent kernel's), the producer runs the tile loop too and the ring
    counts on across tiles (`warp_specialized_tiles.py`): on the SIMT simulator the kernel computes what numpy
    does with 4 tiles of 3 K steps on a 2-slot ring, with mma.sync consumers (sm_90: each iteration releases its
    own slot) and wgmma ones (sm_90a: the tile's last slot released after the drain)."""
    from tessera.backends.simt import run_threads
    from pipeline_kernels import _exact, _host
    M, N, K = 200, 64, 160
    rng = np.random.default_rng(0)
    a, b = _exact(rng.standard_normal((M, K)), tessera.bf16), _exact(rng.standard_normal((K, N)), tessera.bf16)
    args = [_host(a, tessera.bf16), _host(b, tessera.bf16), np.zeros((M, N), np.float16), M, N, K]
    module = persistent_ws.specialize(tessera.reinterpret(args[0], tessera.bf16),
                                      tessera.reinterpret(args[1], tessera.bf16), *args[2:], BM=64, BN=64,
                                      BK=64).module
    fn = lower(module, target, 4).functions[0]
    before, producer, consumers, _ = split_of(fn)
    assert fn.attrs["num_threads"] == 256 and "mbarrier_init" in walk_names(fn.body) and not any(
        op.name == "for" for op in before)      # the ring is set up once, before the split and every loop
    # each role's tile loop around its K loop: the producer's fills the slots, the consumers' reads them
    assert walk_names(producer).count("for") == walk_names(consumers).count("for") == 2
    run_threads(fn, args, (1,))
    np.testing.assert_allclose(args[2].astype(np.float32), (a.astype(np.float64) @ b).astype(np.float16),
                               rtol=2e-3, atol=2e-2)


@tessera.kernel
def ws_in_an_if(a_ptr, b_ptr, c_ptr, M, N, K, BM: tessera.constexpr, BN: tessera.constexpr, BK: tessera.constexpr):
    pid_m = tessera.program_id(0)
    pid_n = tessera.program_id(1)
    a = tessera.view(a_ptr, (M, K))
    b = tessera.view(b_ptr, (K, N))
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    if K > 0:
        for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=2, warp_specialize=True):
            acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
    tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc.to(tessera.f16))


def test_a_loop_nested_in_an_if_is_refused():
    module = ws_in_an_if.specialize(bf16(128, 64), bf16(64, 64), np.zeros((128, 64), np.float16), 128, 64, 64,
                                    BM=64, BN=64, BK=64).module
    message = compile_error(module)
    assert "kernel 'ws_in_an_if'" in message and "not nested in an `if`, a `while` or two loops" in message
    assert "drop warp_specialize=True or move the loop" in message


@tessera.kernel
def two_ws_loops(a_ptr, b_ptr, c_ptr, M, N, K, BM: tessera.constexpr, BN: tessera.constexpr, BK: tessera.constexpr):
    pid_m = tessera.program_id(0)
    pid_n = tessera.program_id(1)
    a = tessera.view(a_ptr, (M, K))
    b = tessera.view(b_ptr, (K, N))
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=2, warp_specialize=True):
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=3, warp_specialize=True):
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
    tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc.to(tessera.f16))


def test_a_second_warp_specialized_loop_is_refused():
    module = two_ws_loops.specialize(bf16(64, 64), bf16(64, 64), np.zeros((64, 64), np.float16), 64, 64, 64,
                                     BM=64, BN=64, BK=64).module
    message = compile_error(module)
    assert "only one tessera.pipeline(warp_specialize=True) loop per kernel" in message
    assert "stages=3, warp_specialize=True" in message and "stages=2" not in message     # the second loop's line


def test_memory_writes_before_the_loop_are_refused():
    """(A load alone before the loop runs in the consumers' branch: test_ws_consumer_prologue.py.)"""
    module = bias_first_ws.specialize(bf16(64, 64), bf16(64, 64), np.zeros((64, 64), np.float16),
                                      np.zeros((64, 64), np.float32), 64, 64, 64, BM=64, BN=64, BK=64).module
    message = compile_error(module)
    assert "kernel 'bias_first_ws'" in message and "'view_store' comes before a tessera.pipeline(warp_specialize=True)" \
        " loop, where the producer warpgroup runs it too" in message
    assert "move it after the loop or into its body" in message


@tessera.kernel
def offset_a_ws(a_ptr, b_ptr, c_ptr, M, N, K, a_offset, BM: tessera.constexpr, BN: tessera.constexpr,
                BK: tessera.constexpr):
    """A's view starts at a pointer the kernel computes: the host cannot describe it to TMA (cp.async fills it)."""
    pid_m = tessera.program_id(0)
    pid_n = tessera.program_id(1)
    a = tessera.view(a_ptr + a_offset, (M, K))
    b = tessera.view(b_ptr, (K, N))
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=2, warp_specialize=True):
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
    tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc.to(tessera.f16))


def test_a_load_tma_cannot_fill_is_refused():
    module = offset_a_ws.specialize(bf16(64 * 64 + 32), bf16(64, 64), np.zeros((64, 64), np.float16), 64, 64, 64, 32,
                                    BM=64, BN=64, BK=64).module
    message = compile_error(module)
    assert "needs every pipelined load filled by TMA, but the load at" in message
    assert "a tessera.view of a pointer parameter with 16-byte aligned rows" in message
