"""Golden generated code: the PTX and AMDGCN text of every tutorial kernel and library GEMM config.

A refactor must not change what the compiler emits. `cases.py` lists the
kernels (the tutorials' and every shipped GEMM config, its WS=True variant
and the fp8 path); `store.py` keeps their text, one xz-compressed file per
target (`sm_80.json.xz`, ...); `test_goldens.py` compiles each kernel once per
target and fails on the first difference with a unified diff.

    python3 -m tests.goldens            # check, as the test does, and list every kernel that differs
    python3 -m tests.goldens --update   # rewrite the goldens (only when a change alters codegen on purpose)

Run both from the repository root. No ptxas or ld.lld is needed: the text
is compared, not the binary.
"""
