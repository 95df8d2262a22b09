"""Run by test_moe_parallel.py: `python moe_ep_worker.py WORLD` spawns WORLD gloo processes on the CPU; each checks
expert_parallel (forward and gradients) and the global-batch load-balancing loss against one process's answer
for the whole batch, and prints "rank R ok"."""

import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tessera.kernels_lib.moe import experts, interleave_gate_up, load_balancing_loss, route
from tessera.kernels_lib.moe.parallel import expert_parallel

E, H, I, K = 8, 16, 12, 2
TOKENS = [5, 9, 1, 7]           # per rank: different sizes


def problem():
    """Every rank's tokens and routing, and all experts' weights: the same on every rank (one seed)."""
    g = torch.Generator().manual_seed(0)
    w13 = interleave_gate_up(torch.randn(E, I, H, generator=g), torch.randn(E, I, H, generator=g)) / H ** 0.5
    w2 = torch.randn(E, H, I, generator=g) / I ** 0.5
    xs = [torch.randn(t, H, generator=g) for t in TOKENS]
    logits = [torch.randn(t, E, generator=g) for t in TOKENS]
    logits[0][:, E - 1] = -30            # the last rank's last expert gets few tokens
    return w13, w2, xs, logits


def check(rank: int, world: int, init_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    w13, w2, xs, all_logits = problem()
    local = slice(rank * E // world, (rank + 1) * E // world)
    x = xs[rank].clone().requires_grad_()
    w13_local, w2_local = w13[local].clone().requires_grad_(), w2[local].clone().requires_grad_()
    weights, ids, counts, _ = route(all_logits[rank], K)
    weights.requires_grad_()
    out = expert_parallel(x, weights, ids, w13_local, w2_local, E)
    grad = torch.ones_like(out) * (rank + 1)
    out.backward(grad)

    x1, w13_1, w2_1, weights1 = (t.detach().clone().requires_grad_() for t in (xs[rank], w13, w2, weights))
    expected = experts(x1, w13_1, w2_1, weights1, ids)
    expected.backward(grad)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, x1.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weights.grad, weights1.grad, rtol=1e-5, atol=1e-5)
    # each rank's expert gradients sum the contributions of every rank's tokens
    for local_grad, full in ((w13_local.grad, w13_1.grad), (w2_local.grad, w2_1.grad)):
        total = full.clone()
        dist.all_reduce(total)
        torch.testing.assert_close(local_grad, total[local], rtol=1e-4, atol=1e-5)

    probs = all_logits[rank].softmax(-1).requires_grad_()
    loss = load_balancing_loss(probs, ids, E, group=dist.group.WORLD, counts=counts)
    everyone = torch.cat([route(all_logits[r], K)[1] for r in range(world)]).reshape(-1)
    f = torch.bincount(everyone.long(), minlength=E).float() / everyone.numel()
    torch.testing.assert_close(loss, E * (f * probs.mean(0)).sum())
    loss.backward()
    torch.testing.assert_close(probs.grad, (E * f / probs.shape[0]).expand_as(probs))
    print(f"rank {rank} ok", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    world = int(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(check, args=(world, os.path.join(tmp, "init")), nprocs=world)
