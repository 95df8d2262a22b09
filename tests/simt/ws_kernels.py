"""Small hand-written producer/consumer thread-IR kernels for the simulator's path scheduling (`backends/simt/paths.py`).

`handoff(k)`: 96 threads, warp 0 produces and warps 1 and 2 consume through
a 2-stage ring in shared memory. Round r: producer lane l copies x[32r + l]
into stage r % 2 and arrives on full[s]; lane l of each consumer warp
waits on full[s] (parity (r // 2) & 1), copies the value to out[32r + l]
(both warps write the same value) and arrives on empty[s]; the producer
waits on empty[s] before refilling a stage (from round 2 on). full[s]
expects 32 arrivals (the producer warp), empty[s] 64 (the consumers). The producer
and consumer loops run in the two sides of one divergent `if`, so the
lockstep simulator can only finish them by switching between the sides.

Switches break one thing each, for the tests of what is reported:
`empty_wait=False` refills without waiting (a race), `consumer_parity`
replaces the consumer's parity expression, `produce=False` drops the
producer's arrivals, `split_consumers` splits the consumer warps into two
nested paths of one warp each (nested divergence), `consumer_sync` adds a
`named_barrier {id = 1, count = ...}` among the consumers, `block_barrier`
puts a block-wide `barrier` into the consumer loop.
"""

from __future__ import annotations

THREADS = 96


def handoff(rounds: int, *, empty_wait=True, consumer_parity="%cuse1", produce=True, split_consumers=False,
            consumer_sync: int | None = None, block_barrier=False) -> str:
    def consumer_loop(n: str) -> str:   # `n` suffixes the value names, so that a function can hold two loops
        body = (
            "      %cs = rem %ck, %c2 : i32\n"
            "      %cuse = div %ck, %c2 : i32\n"
            "      %cuse1 = and %cuse, %c1 : i32\n"
            "      %cfull = addptr %full, %cs : ptr<i64, shared>\n"
            "      %cempty = addptr %empty, %cs : ptr<i64, shared>\n"
            f"      mbarrier_wait %cfull, {consumer_parity}\n"
            "      %cslot = mul %cs, %c32 : i32\n"
            "      %cat = add %cslot, %lane : i32\n"
            "      %csrc = addptr %buf, %cat : ptr<f32, shared>\n"
            "      %cv = load %csrc : f32\n"
            "      %crow = mul %ck, %c32 : i32\n"
            "      %cout = add %crow, %lane : i32\n"
            "      %cdst = addptr %out, %cout : ptr<f32>\n"
            "      store %cdst, %cv\n"
            + (f"      named_barrier {{count = {consumer_sync}, id = 1}}\n" if consumer_sync else "")
            + ("      barrier\n" if block_barrier else "") +
            "      mbarrier_arrive %cempty\n"
            "      yield\n")
        loop = "    for %c0, %rounds, %c1 {\n    ^(%ck: i32):\n" + body + "    }\n"
        for name in ("ck", "cs", "cuse1", "cuse", "cfull", "cempty", "cslot", "cat", "csrc", "cv", "crow", "cout",
                     "cdst"):
            loop = loop.replace(f"%{name}", f"%{name}_{n}") if n else loop
        return loop

    if split_consumers:
        consumer = ("    %low = cmp %tid, %c64 {pred = \"lt\"} : bool\n"
                    "    if %low {\n" + _indent(consumer_loop("a")) + "      yield\n    } {\n"
                    + _indent(consumer_loop("b")) + "      yield\n    }\n")
    else:
        consumer = consumer_loop("")
    refill = ("      %again = cmp %pk, %c2 {pred = \"ge\"} : bool\n"
              "      if %again {\n"
              "        %back = sub %puse, %c1 : i32\n"
              "        %back1 = and %back, %c1 : i32\n"
              "        mbarrier_wait %pempty, %back1\n"
              "        yield\n"
              "      } {\n        yield\n      }\n") if empty_wait else ""
    producer = (
        "      %ps = rem %pk, %c2 : i32\n"
        "      %puse = div %pk, %c2 : i32\n"
        "      %pfull = addptr %full, %ps : ptr<i64, shared>\n"
        "      %pempty = addptr %empty, %ps : ptr<i64, shared>\n"
        + refill +
        "      %prow = mul %pk, %c32 : i32\n"
        "      %pin = add %prow, %lane : i32\n"
        "      %src = addptr %x, %pin : ptr<f32>\n"
        "      %u = load %src : f32\n"
        "      %pslot = mul %ps, %c32 : i32\n"
        "      %pat = add %pslot, %lane : i32\n"
        "      %pdst = addptr %buf, %pat : ptr<f32, shared>\n"
        "      store %pdst, %u\n"
        + ("      mbarrier_arrive %pfull\n" if produce else "") +
        "      yield\n")
    return (
        f"func @handoff(%x: ptr<f32>, %out: ptr<f32>) attributes {{num_threads = {THREADS}, shared_bytes = 512}} {{\n"
        "  %tid = thread_id : i32\n"
        "  %c0 = constant {value = 0} : i32\n"
        "  %c1 = constant {value = 1} : i32\n"
        "  %c2 = constant {value = 2} : i32\n"
        "  %c3 = constant {value = 3} : i32\n"
        "  %c32 = constant {value = 32} : i32\n"
        "  %c64 = constant {value = 64} : i32\n"
        f"  %rounds = constant {{value = {rounds}}} : i32\n"
        "  %buf = shared_alloc {bytes = 256, offset = 0} : ptr<f32, shared>\n"
        "  %full = shared_alloc {bytes = 16, offset = 256} : ptr<i64, shared>\n"
        "  %empty = shared_alloc {bytes = 16, offset = 272} : ptr<i64, shared>\n"
        "  %full1 = addptr %full, %c1 : ptr<i64, shared>\n"
        "  %empty1 = addptr %empty, %c1 : ptr<i64, shared>\n"
        "  %leader = cmp %tid, %c0 {pred = \"eq\"} : bool\n"
        "  if %leader {\n"
        "    mbarrier_init %full, %c32\n"
        "    mbarrier_init %full1, %c32\n"
        "    mbarrier_init %empty, %c64\n"
        "    mbarrier_init %empty1, %c64\n"
        "    yield\n"
        "  } {\n    yield\n  }\n"
        "  barrier\n"
        "  %lane = rem %tid, %c32 : i32\n"
        "  %producer = cmp %tid, %c32 {pred = \"lt\"} : bool\n"
        "  if %producer {\n"
        "    for %c0, %rounds, %c1 {\n    ^(%pk: i32):\n" + producer + "    }\n"
        "    yield\n"
        "  } {\n" + consumer + "    yield\n  }\n"
        "  return\n}\n")


def _indent(text: str) -> str:
    return "".join("  " + line + "\n" for line in text.splitlines())
