"""The fuzzer that stays: mutated kernel sources and unusual-but-valid kernels run through the compiler (sm_80,
sm_90a, gfx942) and the interpreter, each outcome classed as ok / tessera error / other exception / crash / hang.

`test_fuzz_smoke.py` runs a small seeded budget in CI; `python3 -m tests.fuzz.run` runs long campaigns, each case
in a worker subprocess under a time and memory cap (see RESULTS.md for the last one).
"""
