"""Host time per eager operator: the cost model's ``HostProfile.op_overhead_s`` on a CPU trial device.

A CPU rank runs every operator of its forward and backward on its own cores: Python, the dispatcher and
autograd cost it microseconds per operator whatever the tensor size, and at the small shapes of CPU trials
that is a large share of a step (the per-micro-batch cost that makes small micro-batches slow there). The
probe times the forward and backward of one trial transformer block (``trials.model.Block``, the operator
mix the trials run) on a single token, where the arithmetic is negligible, counts the ATen operators it
dispatches (``TorchDispatchMode``), and reports seconds per operator -- on every rank at once, as trial
ranks share the node, the median rank.

Torch-native tensor parallelism runs part of a block on DTensors, and each DTensor operator costs the host
far more than a plain one (sharding propagation, redistribution planning, the local operator, the re-wrap).
With a process group up, the probe also times a two-block trial model under autotune's TP plan, with and
without sequence parallelism, on a TP mesh of one rank (so no collective runs: their time is the collective
probe's) and reports what each DTensor operator costs beyond the plain operators' share. And a TP
collective issued by a DTensor redistribution (functional collectives, the ``AsyncCollectiveTensor`` wait,
the re-wrap) costs the host more than the same collective called directly, which is what the collective
probe times: on a mesh over every rank of the node the probe times the three redistributions torch TP issues
(``Shard(1) -> Replicate``: all-gather, ``Partial -> Shard(1)``: reduce-scatter, ``Partial -> Replicate``:
all-reduce) against the direct calls and reports the median difference per collective. It times the process's
CPU time, not wall time: the difference is host work, and the wall time of a collective on ranks that share
cores swings with the OS's scheduling by more than that work (4 gloo ranks on 2 cores, medians of 30:
wall-time differences -1.0 to +1.5 ms from run to run, CPU time 0.43-0.58 ms). Where the node's ranks
outnumber its cores, a rank's CPU work takes ``ranks / cores`` as long in wall time while all ranks work,
which is how ``op_overhead`` (wall time, every rank at once) measures too: the CPU time is scaled by that.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from autotune.specs import ModelSpec
from autotune.trials.model import Block, build_model
from autotune.trials.train import lm_loss

__all__ = ["PROBE_BLOCK", "count_ops", "op_overhead", "dtensor_op_overhead", "dtensor_collective_overhead"]

PROBE_BLOCK = ModelSpec(
    name="probe-block",
    hidden_size=128,
    num_layers=1,
    num_heads=4,
    num_kv_heads=4,
    ffn_hidden_size=344,
    vocab_size=1024,
    max_seq_len=64,
    gated_mlp=True,
)
"""The block timed: the ``tiny`` preset's shape (any small shape dispatches the same operators)."""


class _Counter(TorchDispatchMode):
    """Operators dispatched; those with a DTensor among their arguments also in ``dtensor`` (the DTensor's
    local operators run below the mode and are not seen)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = self.dtensor = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops += 1
        self.dtensor += DTensor in types
        return func(*args, **(kwargs or {}))


def count_ops(fn: Any) -> int:
    """ATen operators ``fn()`` dispatches (forward and, if it calls it, backward)."""
    with _Counter() as counter:
        fn()
    return counter.ops


def _timed(fn: Any, repeats: int, iters: int) -> float:
    """Median seconds of ``fn()`` after a warm-up."""
    for _ in range(10):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        times.append((time.perf_counter() - start) / iters)
    return statistics.median(times)


def _median_over_ranks(mine: float) -> tuple[float, list[Any]]:
    if dist.is_initialized():
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
    else:
        everyone = [mine]
    return statistics.median(everyone), everyone


def op_overhead(*, repeats: int = 7, iters: int = 50) -> dict[str, Any]:
    """Seconds per operator of a block's forward + backward on one token (module docstring)."""
    block = Block(PROBE_BLOCK)
    x = torch.randn(1, 1, PROBE_BLOCK.hidden_size, requires_grad=True)

    def step() -> None:
        block(x).sum().backward()

    ops = count_ops(step)
    per_op, everyone = _median_over_ranks(_timed(step, repeats, iters) / ops)
    out: dict[str, Any] = {"op_overhead_s": per_op, "ops_per_step": ops, "per_rank_s": everyone, "tokens": 1}
    if dist.is_initialized():
        out |= dtensor_op_overhead(per_op, repeats=repeats, iters=max(1, iters // 5))
        if dist.get_world_size() > 1:
            out |= dtensor_collective_overhead()
    return out


def dtensor_op_overhead(op_overhead_s: float, *, repeats: int = 7, iters: int = 10) -> dict[str, Any]:
    """Seconds per DTensor operator beyond the plain operators' ``op_overhead_s`` (module docstring); needs
    an initialized process group (every rank builds the mesh; each times its own one-rank TP group)."""
    from torch.distributed.device_mesh import init_device_mesh

    from autotune.trials.parallelize import apply_tp

    mesh = init_device_mesh("cpu", (dist.get_world_size(), 1), mesh_dim_names=("rest", "tp"))
    spec = dataclasses.replace(PROBE_BLOCK, num_layers=2)
    x = torch.randint(0, spec.vocab_size, (1, 2), generator=torch.Generator().manual_seed(0))
    seconds = plain = dtensor = 0.0
    for sequence_parallel in (False, True):
        model = build_model(spec, device="cpu", seed=0)
        apply_tp(model, mesh["tp"], sequence_parallel=sequence_parallel)

        def step(model: torch.nn.Module = model) -> None:
            lm_loss(model(x), x).backward()

        step()  # DTensor caches its sharding decisions
        with _Counter() as counter:
            step()
        seconds += _timed(step, repeats, iters)
        plain, dtensor = plain + counter.ops - counter.dtensor, dtensor + counter.dtensor
    mine = max(0.0, seconds - plain * op_overhead_s) / dtensor
    per_op, everyone = _median_over_ranks(mine)
    return {
        "dtensor_op_overhead_s": per_op,
        "dtensor_per_rank_s": everyone,
        "dtensor_ops_per_step": int(dtensor),
        "plain_ops_per_step": int(plain),
    }


def dtensor_collective_overhead(*, iters: int = 30) -> dict[str, Any]:
    """Seconds a TP collective issued through a DTensor redistribution costs beyond the direct call
    (module docstring): a ``[2, 64, 256]`` activation (the trials' micro-batch x seq-len x ``tiny`` width
    order) on a mesh over all ranks, every rank at once. Each iteration times the redistribution and the
    direct call back to back in CPU time, each after a barrier (so neither starts with ranks out of step); per
    collective the median over iterations of the difference, on the median rank, times the ranks' share of a
    core; reported: the median collective."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard

    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    group = mesh.get_group()
    full = torch.randn(2, 64 * world // 2, 256)
    part = full.chunk(world, dim=1)[0].contiguous()
    sharded = DTensor.from_local(part, mesh, [Shard(1)], run_check=False)
    partial = DTensor.from_local(full, mesh, [Partial()], run_check=False)
    flat_part, gathered, scattered = part.reshape(-1), torch.empty(full.numel()), torch.empty(part.numel())
    pairs = {
        "all_gather": (
            lambda: sharded.redistribute(mesh, [Replicate()]).to_local(),
            lambda: dist.all_gather_into_tensor(gathered, flat_part, group=group),
        ),
        "reduce_scatter": (
            lambda: partial.redistribute(mesh, [Shard(1)]).to_local(),
            lambda: dist.reduce_scatter_tensor(scattered, full.reshape(-1).clone(), group=group),
        ),
        "all_reduce": (
            lambda: partial.redistribute(mesh, [Replicate()]).to_local(),
            lambda: dist.all_reduce(full.clone(), group=group),
        ),
    }

    def once(fn: Any) -> float:
        dist.barrier(group)
        start = time.process_time()
        fn()
        return time.process_time() - start

    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    share = max(1.0, ranks / len(os.sched_getaffinity(0)))

    extra = {}
    for name, (via_dtensor, direct) in pairs.items():
        for _ in range(5):
            once(via_dtensor), once(direct)
        diffs = [once(via_dtensor) - once(direct) for _ in range(iters)]
        mine, _ = _median_over_ranks(statistics.median(diffs))
        extra[name] = mine * share
    return {
        "dtensor_collective_overhead_s": max(0.0, statistics.median(extra.values())),
        "dtensor_collective_extra_s": extra,
        "dtensor_collective_cpu_share": share,
    }
