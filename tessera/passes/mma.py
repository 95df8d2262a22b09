"""Matrix-instruction dot: when `dot` runs on wgmma, mma.sync or MFMA, on which instruction, in which layouts.

`dot(a[M,K], b[K,N], acc[M,N])` runs on the target's matrix instruction
when its dtypes have one and the tile is a multiple of the instruction's
m x n x k (`instruction_for`):

    target                    inputs -> acc              instruction                thread op
    "wgmma" (sm_90a),         f16, bf16 -> f32           wgmma m64nNk16             wgmma {m = 64, n = N, k = 16}
      num_warps % 4 == 0      e4m3/e5m2 -> f32 (any mix) wgmma m64nNk32             wgmma {m = 64, n = N, k = 32}
                              (M % 64, K % k, N % 8; N <= 256 per instruction, else the largest such divisor)
    "mma.sync", 32 lanes      f16, bf16 -> f32           mma.sync m16n8k16          mma {m = 16, n = 8, k = 16}
                              f32 -> f32, tf32 asked     mma.sync m16n8k8 .tf32     mma {m = 16, n = 8, k = 8}
                              i8, u8 -> i32              mma.sync m16n8k32 .s8/.u8  mma {m = 16, n = 8, k = 32}
    + "mma.fp8" (sm_89+)      e4m3/e5m2 -> f32           mma.sync m16n8k32 .e4m3..  mma {m = 16, n = 8, k = 32}
    "mfma", 64 lanes          f16, bf16 -> f32           v_mfma_f32_32x32x8         mfma {m = 32, n = 32, k = 8}
                                                         v_mfma_f32_16x16x16        mfma {m = 16, n = 16, k = 16}
    + "mfma.wide" (gfx950)    f16, bf16 -> f32           v_mfma_f32_32x32x16        mfma {m = 32, n = 32, k = 16}
                                                         v_mfma_f32_16x16x32        mfma {m = 16, n = 16, k = 32}
    + "mfma.fp8" (gfx950)     e4m3/e5m2 -> f32 (any mix) v_mfma_f32_32x32x64_f8f6f4 mfma {m = 32, n = 32, k = 64}
                                                         v_mfma_f32_32x32x16_fp8..  mfma {m = 32, n = 32, k = 16}
                                                         v_mfma_f32_16x16x128_f8f6f4 mfma {m = 16, n = 16, k = 128}
                                                         v_mfma_f32_16x16x32_fp8..  mfma {m = 16, n = 16, k = 32}

(MFMA 32x32 when M and N are multiples of 32, else 16x16; on "mfma.wide"
the double-K form of that size when K allows it (K % 16, K % 32), which
halves the instructions per flop; fp8 on gfx950 the double-rate f8f6f4
form when K allows it (K % 64, K % 128: four times the k of the fp8 form;
the MI355X's fp8 peak, twice its bf16 peak, is quoted for these), else the
k16 / k32 fp8 form; wgmma first
where it fits, else mma.sync on sm_90a too. fp8 wgmma reads only K-major
operands: a register operand is stored K-major by its owners whatever its
layout, but a pipelined fp8 load contiguous along M/N cannot fill a K-major
slot by whole chunks, so it stays an ordinary load (`pipeline_plan`).
sm_90 has no native fp8 mma.sync (ptxas emulates it), which is why fp8
takes wgmma wherever the shape allows. A wgmma dot in the body of a
`for {stages >= 2}` loop reads its operands straight from the cp.async ring
slots: `schedule/pipeline_plan.py`.) f32 inputs
use tf32 only when the dot says `input_precision = "tf32"`: by default (and
with "ieee") an f32 dot stays exact, on FMA, like Triton's. Anything else
(other dtypes, fp8 without "mma.fp8" / "mfma.fp8", shapes that do not
divide, other targets) keeps the FMA lowering (`lowering/dot.py`). gfx942
has fp8 MFMA too, but on the fnuz formats, which would misread Tessera's
OCP fp8 bytes (`mfma_layouts`): its fp8 dots stay exact, on FMA.

One planning algorithm serves every instruction, parameterized by its shape,
the lanes it spans and its fragment layouts (`MatrixInstruction`). The
issuing groups (warps; warpgroups of 4 warps for wgmma) tile the M x N
accumulator in m x n fragments: WM x WN groups (split like the blocked
layout: a factor of two at a time to whichever of M, N has more elements
left per warp; warps that find no fragment to own replicate the whole
accumulator), each holding RM x RN fragments of its (M/WM) x (N/WN) block
as more registers:

    C  local(RM, RN) . replicated(WR) . spatial(WM, WN) . C fragment
    A  local(RM, RK) . replicated(WR) . spatial(WM, 1) . replicated(WN) . A fragment
    B  local(RK, RN) . replicated(WR * WM) . spatial(1, WN) . B fragment

A warp needs the rows of A and the columns of B of its block, so A is
replicated over the WN warps that share rows, and B over the WM warps that
share columns. Register (rm, rn, i) of C is `(rm * RN + rn) * c + i`; of A
`(rm * RK + rk) * a + i`; of B `(rk * RN + rn) * b + i`, with a, b, c the
registers per lane of one fragment and i the fragment's own register order
(the order the instruction takes them in).

wgmma reads A and B from shared memory (`MatrixInstruction.a`/`.b` are
None: layout assignment asks nothing of the operands) and its fragment is
64 rows by the whole N (N <= 256), so the split only ever goes along M: each
warpgroup owns RM 64-row slabs (WR warpgroups replicate when M is too short):

    C  local(RM, RN) . replicated(WR) . spatial(WM, 1) . wgmma_accumulator(n)

Chained dots (`chained`: attention's S = Q K^T, P = f(S), O += P V) split
along M only, like FlashAttention-2 and Triton's chained-dot rule: then
every warp holds whole rows of S, P and O, so a row max or sum of S is a
reduction inside the warp, the row factors of S apply to O where they are,
and P's accumulator registers are already the A fragment of the next dot
(the m16n8 C fragments of two neighbouring column blocks hold exactly the
m16n8k16 A fragment): no shared memory between the two products.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera.ir import dtypes as dt
from tessera.ir.core import Operation, enclosing_function
from tessera.ir.layouts import RegisterLayout, local, replicated, spatial
from tessera.ir.mfma_layouts import MFMA_FP8, MFMA_INPUTS, mfma_fragments
from tessera.ir.mma_layouts import FP8, mma_accepts, mma_fragments
from tessera.ir.ops import OPS
from tessera.ir.target import Target
from tessera.ir.types import scalar_dtype
from tessera.ir.wgmma_layouts import WARPGROUP, WGMMA_M, wgmma_accumulator, wgmma_k

# Tensor-core operands computed before the loop their dots are in stay in their fragment registers for the whole
# loop while together they need at most this many 32-bit registers per thread; the others (attention's Q for head
# dim 256, the backward's V after K) are kept in shared memory and read with ldmatrix in every iteration where
# the target has ldmatrix (`layout_assignment.hoist_invariant_operands`, `lowering/invariant_operands.py`).
RESIDENT_OPERAND_REGISTERS = 32


@dataclass(frozen=True)
class MatrixInstruction:
    """One warp- (or warpgroup-) wide matrix instruction: D (m x n) = A (m x k) @ B (k x n) + C, and its fragments
    (`a`, `b` None: the instruction reads that operand from shared memory, as wgmma does)."""

    op: str                     # the thread op that runs it
    m: int
    n: int
    k: int
    lanes: int                  # the threads it spans: a warp (wave), or a warpgroup
    a: RegisterLayout | None
    b: RegisterLayout | None
    c: RegisterLayout
    attrs: dict = field(default_factory=dict, compare=False)    # of the thread op

    def divides(self, m: int, n: int, k: int) -> bool:
        return m % self.m == 0 and n % self.n == 0 and k % self.k == 0


def mma(m: int, n: int, k: int) -> MatrixInstruction:
    return MatrixInstruction("mma", m, n, k, 32, *mma_fragments(m, n, k), attrs={"m": m, "n": n, "k": k})


def wgmma(n: int, dtype: dt.DType, dtype_b: dt.DType | None = None) -> MatrixInstruction:
    """wgmma m64nNk16 (f16/bf16) or m64nNk32 (e4m3/e5m2, B of `dtype_b` when it differs)."""
    k = wgmma_k(dtype.bits // 8)
    attrs = {"m": WGMMA_M, "n": n, "k": k, "dtype": dtype.name}
    if dtype_b is not None and dtype_b != dtype:
        attrs["dtype_b"] = dtype_b.name
    return MatrixInstruction("wgmma", WGMMA_M, n, k, WARPGROUP, None, None, wgmma_accumulator(n), attrs=attrs)


MMA_M16N8K16 = mma(16, 8, 16)
MMA_M16N8K8 = mma(16, 8, 8)
MMA_M16N8K32 = mma(16, 8, 32)


def mfma(m: int, n: int, k: int) -> MatrixInstruction:
    return MatrixInstruction("mfma", m, n, k, 64, *mfma_fragments(m, n, k), attrs={"m": m, "n": n, "k": k})


MFMA_32X32X8 = mfma(32, 32, 8)
MFMA_16X16X16 = mfma(16, 16, 16)
MFMA_32X32X16 = mfma(32, 32, 16)        # gfx950 ("mfma.wide"; with fp8 operands, "mfma.fp8")
MFMA_16X16X32 = mfma(16, 16, 32)
MFMA_32X32X64 = mfma(32, 32, 64)        # gfx950 fp8 only ("mfma.fp8": v_mfma_f32_32x32x64_f8f6f4)
MFMA_16X16X128 = mfma(16, 16, 128)


def instruction_for(target: Target, m: int, n: int, k: int, a: dt.DType = dt.f16, b: dt.DType | None = None,
                    acc: dt.DType = dt.f32, tf32: bool = False, num_warps: int = 1) -> MatrixInstruction | None:
    """The matrix instruction an m x n x k dot of `a` x `b` (default: `a`) inputs into an `acc` accumulator uses on
    `target` with `num_warps` warps, or None (FMA). f32 inputs qualify only with `tf32` (the dot asked for
    input_precision = "tf32"); wgmma needs whole warpgroups."""
    b = a if b is None else b
    wgmma_inputs = (a == b and a in (dt.f16, dt.bf16)) or (a in FP8 and b in FP8)
    if (target.has("wgmma") and num_warps % (WARPGROUP // target.warp_size) == 0 and wgmma_inputs
            and acc == dt.f32 and m % WGMMA_M == 0 and k % wgmma_k(a.bits // 8) == 0 and n % 8 == 0):
        return wgmma(next(w for w in range(min(n, 256), 7, -8) if n % w == 0), a, b)
    if target.has("mma.sync") and target.warp_size == 32:
        if a == dt.f32 and not tf32:
            return None
        if (a in FP8 or b in FP8) and not target.has("mma.fp8"):
            return None
        candidates = tuple(inst for inst in (MMA_M16N8K16, MMA_M16N8K8, MMA_M16N8K32)
                           if mma_accepts((inst.m, inst.n, inst.k), a, b, acc))
    elif target.has("mfma") and target.warp_size == 64 and acc == dt.f32 and (a == b and a in MFMA_INPUTS):
        # The larger m x n first (half the instructions per flop), and of one m x n the double-K form first.
        candidates = ((MFMA_32X32X16, MFMA_32X32X8, MFMA_16X16X32, MFMA_16X16X16) if target.has("mfma.wide")
                      else (MFMA_32X32X8, MFMA_16X16X16))
    elif target.has("mfma.fp8") and target.warp_size == 64 and acc == dt.f32 and a in MFMA_FP8 and b in MFMA_FP8:
        # OCP fp8 (gfx950; not gfx942's fnuz, see above): the double-rate f8f6f4 form first, as above
        candidates = (MFMA_32X32X64, MFMA_32X32X16, MFMA_16X16X128, MFMA_16X16X32)
    else:
        return None
    return next((inst for inst in candidates if inst.divides(m, n, k)), None)


def fma_reason(target: Target, a: dt.DType, b: dt.DType) -> str:
    """Why a dot of `a` x `b` inputs keeps FMA on `target` when the reason is its dtypes ("" otherwise): the
    tail of the pipeline planner's refusal (`schedule/pipeline_plan.py`)."""
    if target.has("mfma") and (a in MFMA_FP8 or b in MFMA_FP8) and not target.has("mfma.fp8"):
        return (f" ({target.name} has no MFMA for the OCP e4m3/e5m2 of Tessera's fp8: gfx942's fp8 MFMA reads the "
                f"fnuz formats, so fp8 dots run exactly on FMA there; gfx950 multiplies OCP fp8 on MFMA)")
    return ""


@dataclass(frozen=True)
class MmaPlan:
    """The layouts of one matrix-instruction dot and how many fragments each warp holds."""

    instruction: MatrixInstruction
    a: RegisterLayout | None    # None: from shared memory (wgmma)
    b: RegisterLayout | None
    c: RegisterLayout
    rm: int     # fragments per warp (warpgroup) along M
    rn: int     # ... along N
    rk: int     # ... along K (the whole K: every warp walks it)
    wm: int = 1     # warps (warpgroups) along M: fragment row rm of group g is at row (rm * wm + g) * m


def mma_plan(op: Operation, target: Target, num_warps: int) -> MmaPlan | None:
    """How `op` (a dot) runs on the target's matrix instruction with `num_warps` warps; None: it does not (FMA)."""
    if op.name != "dot":
        return None
    a, b, acc = (v.type for v in op.operands)
    (m, k), (_, n) = a.shape, b.shape
    tf32 = op.attrs.get("input_precision") == "tf32"
    inst = instruction_for(target, m, n, k, scalar_dtype(a), scalar_dtype(b), scalar_dtype(acc), tf32, num_warps)
    if inst is None:
        return None
    rm, rn, rk = m // inst.m, n // inst.n, k // inst.k
    wm = wn = 1
    left = num_warps * target.warp_size // inst.lanes      # issuing groups: warps, or warpgroups
    from_shared = inst.a is None                            # wgmma: its slab spans N, so split M only
    rows_only = from_shared or chained(op)                 # whole rows per warp (see the module docstring)
    while left > 1:
        if rm % 2 == 0 and (rows_only or rm * inst.m >= rn * inst.n or rn % 2):
            wm, rm = wm * 2, rm // 2
        elif rn % 2 == 0 and not rows_only:
            wn, rn = wn * 2, rn // 2
        else:
            break
        left //= 2
    wr = left
    c = local(rm, rn) * replicated(wr) * spatial(wm, wn) * inst.c
    if from_shared:
        return MmaPlan(inst, None, None, c, rm, rn, rk, wm)
    a_layout = local(rm, rk) * replicated(wr) * spatial(wm, 1) * replicated(wn) * inst.a
    b_layout = local(rk, rn) * replicated(wr * wm) * spatial(1, wn) * inst.b
    return MmaPlan(inst, a_layout, b_layout, c, rm, rn, rk, wm)



# Ops a chain of dots passes through from one product to the next operand A: lane-wise math (the scale, the
# mask's select, exp2, the cast to f16/bf16), moves of lanes, and the results of `if`s (a masked branch).
_CHAIN_LIMIT = 256          # values visited per search: chains are short; this bounds the walk in big kernels


def chained(op: Operation) -> bool:
    """Whether dot `op` is a link of a chain of dots: its A operand is computed lane by lane from another dot's
    result, or its own result reaches another dot's A operand that way (through elementwise ops, shape ops
    other than transposes, convert_layout and `if` results, within the function)."""
    if _source_dots(op.operands[0]):
        return True
    fn = enclosing_function(op)
    return fn is not None and any(other is not op and op in _source_dots(other.operands[0])
                                  for other in fn.walk() if other.name == "dot")


def _source_dots(value) -> set[Operation]:
    """The dots whose results `value` is computed from lane by lane (see `chained`)."""
    found, seen, work = set(), set(), [value]
    while work and len(seen) < _CHAIN_LIMIT:
        v = work.pop()
        if v in seen:
            continue
        seen.add(v)
        producer = v.owner
        if not isinstance(producer, Operation):
            continue                                    # a block argument: a carried value ends the chain
        if producer.name == "dot":
            found.add(producer)
        elif producer.name == "if":
            work.extend(region.terminator.operands[v.index] for region in producer.regions)
        elif producer.name == "permute":
            continue                                    # a transpose moves lanes between threads anyway
        elif OPS[producer.name].elementwise or OPS[producer.name].shape_op or producer.name == "convert_layout":
            work.extend(producer.operands)
    return found


