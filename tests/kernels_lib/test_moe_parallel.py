"""tessera.kernels_lib.moe.parallel.expert_parallel and the global-batch load-balancing loss, on the CPU with
torch.distributed's gloo backend: several processes, each holding its own tokens and E / world experts.

Specification (checked in each process by moe_ep_worker.py): expert_parallel's output, and its gradients in
x, the routing weights and the rank's own experts, are what one process computes for that rank's tokens with
all experts (the expert gradients summed over every rank's tokens); load_balancing_loss with a group counts
f over every rank's tokens (one all-reduce) and differentiates through the local probabilities.
"""

import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("moe_ep_worker.py")


@pytest.mark.parametrize("world", [2])
def test_expert_parallel_over_gloo(world):
    done = subprocess.run([sys.executable, str(WORKER), str(world)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(f"rank {r} ok" in done.stdout for r in range(world)), done.stdout     # lines may interleave
