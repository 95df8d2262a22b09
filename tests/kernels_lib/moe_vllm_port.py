"""vLLM's fused_moe_kernel (the gate/up GEMM over sorted token ids), ported line by line as a new user would:
tiles of pointers carried through the K loop, `% N` column offsets. docs/moe.md explains its register use."""

import tessera

SIGNATURE = "*f16:16,*f16:16,*f16:16,*i32:16,*i32:16,*i32:16,i32:16,i32:16,i32,i32,i32:16,i32:1,i32:16,i32:16,i32:1," \
            "i32:16,i32:1"


@tessera.kernel
def fused_moe_kernel(a_ptr, b_ptr, c_ptr, sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr,
                     N, K, EM, num_valid_tokens, stride_am, stride_ak, stride_be, stride_bk, stride_bn,
                     stride_cm, stride_cn, BLOCK_M: tessera.constexpr, BLOCK_N: tessera.constexpr,
                     BLOCK_K: tessera.constexpr, GROUP_M: tessera.constexpr, top_k: tessera.constexpr,
                     PID_N_NONNEGATIVE: tessera.constexpr = False):
    pid = tessera.program_id(0)
    num_pid_m = tessera.cdiv(EM, BLOCK_M)
    num_pid_n = tessera.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    if PID_N_NONNEGATIVE:           # the one line that fixes it: the analysis cannot see that group_size_m > 0
        tessera.assume(pid_n >= 0)
    if pid_m * BLOCK_M >= tessera.load(num_tokens_post_padded_ptr):
        return
    offs_token = tessera.load(sorted_token_ids_ptr + pid_m * BLOCK_M + tessera.arange(0, BLOCK_M))
    token_mask = offs_token < num_valid_tokens
    off_experts = tessera.load(expert_ids_ptr + pid_m)
    offs_bn = (pid_n * BLOCK_N + tessera.arange(0, BLOCK_N)) % N
    offs_k = tessera.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_token[:, None] // top_k * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + off_experts * stride_be + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
    acc = tessera.zeros((BLOCK_M, BLOCK_N), dtype=tessera.f32)
    for k in range(0, tessera.cdiv(K, BLOCK_K)):
        a = tessera.load(a_ptrs, mask=token_mask[:, None] & (offs_k[None, :] < K - k * BLOCK_K), other=0.0)
        b = tessera.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
        acc = tessera.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    offs_cn = pid_n * BLOCK_N + tessera.arange(0, BLOCK_N)
    c_ptrs = c_ptr + stride_cm * offs_token[:, None] + stride_cn * offs_cn[None, :]
    tessera.store(c_ptrs, acc.to(tessera.f16), mask=token_mask[:, None] & (offs_cn[None, :] < N))
