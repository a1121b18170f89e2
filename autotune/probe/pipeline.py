"""Host time per action of torch's pipeline schedules: the cost model's ``HostProfile.pipeline_action_s`` on a
CPU trial device.

Each forward or backward a ``torch.distributed.pipelining`` schedule runs on a stage (an *action*) also costs
the host: the schedule's own bookkeeping, the stage's input and output handling, and the point-to-point
sends and receives to the neighbouring stage, whose latency the next rank waits on. On a CPU, where the host
is the device, that cost is on the critical path, and it differs by schedule. In its steady state
``Schedule1F1B`` (one stage per rank, ``PipelineScheduleSingle``) fires each send together with the next
receive in one batch (``fwd_send_bwd_recv``, ``bwd_send_fwd_recv``). ``ScheduleInterleaved1F1B``
(``_PipelineScheduleRuntime``) runs every send and every receive as an action of its own, posting a receive
just before the compute that needs it.

The probe times exactly that: pipelines of two adjacent ranks of a node (all pairs at once, every rank busy as
in a trial) run each schedule over stages that do almost no arithmetic (one 8-wide linear layer on one row per
micro-batch) at 4, 8 and 16 micro-batches per step, in three sweeps with the schedules in turn. Per sweep the
slope of step time over actions per rank (``2 m`` forward and backward actions, ``4 m`` with two virtual
stages, ``6 m`` for the zero-bubble schedules, interleaved and ZBV, whose backward is an input and a weight
action) is fitted by least squares -- the intercept holds the fill, the drain and the step's fixed costs; a
rank reports its median sweep and the probe the median rank. A stage's own operators (some 10 per action,
4 us each on this VM) are under a fifth of what is measured and are not subtracted: the trial model's
operators are charged by ``costmodel.hostops`` anyway.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from autotune.planenums import Schedule

__all__ = ["SCHEDULES", "MICROBATCHES", "pipeline_action_overhead"]

SCHEDULES = ("gpipe", "1f1b", "interleaved", "interleaved-zb", "zbv")
"""``plan.Schedule`` values, as the trials build them (``trials.parallelize.build_schedule``)."""
MICROBATCHES = (4, 8, 16)
_WIDTH = 8


class _Stage(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(_WIDTH, _WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def _loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((out - target) ** 2).mean()


def _schedule(name: str, microbatches: int, pair_rank: int, group: dist.ProcessGroup, device: torch.device):
    from torch.distributed import pipelining as pipe

    schedule = Schedule(name)
    cls = getattr(pipe, schedule.torch_class)
    if schedule.looped or schedule.v_shape:  # 2 chunks per rank, placed as trials.parallelize.split_stages
        ids = (pair_rank, 3 - pair_rank) if schedule.v_shape else (pair_rank, pair_rank + 2)
        stages = [pipe.PipelineStage(_Stage().to(device), i, 4, device, group=group) for i in ids]
        return cls(stages, n_microbatches=microbatches, loss_fn=_loss)
    stage = pipe.PipelineStage(_Stage().to(device), pair_rank, 2, device, group=group)
    return cls(stage, n_microbatches=microbatches, loss_fn=_loss)


def _step_s(
    schedule: Any, pair_rank: int, microbatches: int, device: torch.device, *, iters: int, v_shape: bool
) -> float:
    x = torch.randn(microbatches, _WIDTH, device=device)
    y = torch.randn(microbatches, _WIDTH, device=device)

    def step() -> None:
        if pair_rank == 0 and v_shape:  # the first and the last stage
            schedule.step(x, target=y, losses=[])
        elif pair_rank == 0:
            schedule.step(x)
        elif v_shape:
            schedule.step()
        else:
            schedule.step(target=y, losses=[])

    for _ in range(3):
        step()
    times = []
    for _ in range(iters):
        dist.barrier()
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of seconds over actions."""
    mx = statistics.fmean(a for a, _ in points)
    my = statistics.fmean(s for _, s in points)
    return sum((a - mx) * (s - my) for a, s in points) / sum((a - mx) ** 2 for a, _ in points)


def pipeline_action_overhead(
    device: torch.device, *, local_world_size: int, iters: int = 15, repeats: int = 3
) -> dict[str, Any] | None:
    """Seconds per action of each schedule (module docstring): per rank the median slope of ``repeats``
    sweeps (the schedules in turn in each), then the median rank; None with fewer than 2 ranks per node.
    Every rank calls it (it builds process groups)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if local_world_size < 2:
        return None
    pairs = [
        [r, r + 1]
        for node in range(0, world, local_world_size)
        for r in range(node, node + local_world_size - 1, 2)
    ]
    groups = [dist.new_group(p) for p in pairs]  # every rank creates every group, in the same order
    mine = next((i for i, p in enumerate(pairs) if rank in p), None)
    slopes: dict[str, list[float]] = {}
    for _ in range(repeats):
        for name in SCHEDULES:
            points = []
            for m in MICROBATCHES:
                if mine is None:  # an odd rank out idles through the barriers
                    for _ in range(iters):
                        dist.barrier()
                    continue
                pair_rank = pairs[mine].index(rank)
                schedule = _schedule(name, m, pair_rank, groups[mine], device)
                # forward and backward per chunk; the zero-bubble backward is two actions (input, weight)
                kind = Schedule(name)
                actions = (3 if kind.zero_bubble else 2) * m * (2 if kind.looped or kind.v_shape else 1)
                seconds = _step_s(schedule, pair_rank, m, device, iters=iters, v_shape=kind.v_shape)
                points.append((actions, seconds))
            if points:
                slopes.setdefault(name, []).append(_slope(points))
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, {k: statistics.median(v) for k, v in slopes.items()} if slopes else None)
    measured = [e for e in everyone if e]
    return {
        "pipeline_action_s": {
            name: max(0.0, statistics.median(e[name] for e in measured)) for name in SCHEDULES
        },
        "per_rank_s": everyone,
        "microbatches": list(MICROBATCHES),
        "repeats": repeats,
        "pairs": pairs,
    }
