"""Host time per eager operator: the cost model's ``GPUSpec.op_overhead_s`` on a CPU trial device.

A CPU rank runs every operator of its forward and backward on its own cores: Python, the dispatcher and
autograd cost it microseconds per operator whatever the tensor size, and at the small shapes of CPU trials
that is a large share of a step (the per-micro-batch cost that makes small micro-batches slow there). The
probe times the forward and backward of one trial transformer block (``trials.model.Block``, the operator
mix the trials run) on a single token, where the arithmetic is negligible, counts the ATen operators it
dispatches (``TorchDispatchMode``), and reports seconds per operator -- on every rank at once, as trial
ranks share the node, the median rank.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from autotune.specs import ModelSpec
from autotune.trials.model import Block

__all__ = ["PROBE_BLOCK", "count_ops", "op_overhead"]

PROBE_BLOCK = ModelSpec(name="probe-block", hidden_size=128, num_layers=1, num_heads=4, num_kv_heads=4,
                        ffn_hidden_size=344, vocab_size=1024, max_seq_len=64, gated_mlp=True)
"""The block timed: the ``tiny`` preset's shape (any small shape dispatches the same operators)."""


class _Counter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn: Any) -> int:
    """ATen operators ``fn()`` dispatches (forward and, if it calls it, backward)."""
    with _Counter() as counter:
        fn()
    return counter.ops


def op_overhead(*, repeats: int = 7, iters: int = 50) -> dict[str, Any]:
    """Seconds per operator of a block's forward + backward on one token (module docstring)."""
    block = Block(PROBE_BLOCK)
    x = torch.randn(1, 1, PROBE_BLOCK.hidden_size, requires_grad=True)

    def step() -> None:
        block(x).sum().backward()

    ops = count_ops(step)
    for _ in range(10):
        step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            step()
        times.append((time.perf_counter() - start) / iters)
    mine = statistics.median(times) / ops
    if dist.is_initialized():
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
    else:
        everyone = [mine]
    return {"op_overhead_s": statistics.median(everyone), "ops_per_step": ops,
            "per_rank_s": everyone, "tokens": 1}
