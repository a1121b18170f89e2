"""How much of a collective hides behind compute on these devices: the cost model's ``dp_overlap_fraction``.

DP/ZeRO/FSDP traffic overlaps backward GEMMs (``costmodel.overlap``). How much it can is a property of
the machine, not a constant: NCCL kernels take SMs and HBM bandwidth from the GEMMs they run beside (PyTorch
DDP paper, Li et al. 2020, Sec. 5), and gloo reduces and copies on the same CPU cores the trial's compute
threads use, so on a CPU node with no spare core little or nothing hides.

The probe measures it the way a backward pass meets it: ``t_c``, an all-reduce of ``nbytes`` alone; ``t_g``,
a run of GEMMs sized to last about as long; ``t_both``, the all-reduce issued asynchronously (NCCL's stream,
gloo's worker thread) with the same GEMMs run before waiting on it. The hidden time is ``t_c + t_g - t_both``;
the fraction is that over ``min(t_c, t_g)`` (1: fully hidden; 0: the two run one after the other), the
median of ``repeats`` and the slowest rank's times, as nccl-tests reports its slowest rank.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from autotune.probe.gemm import sync

__all__ = ["overlap_fraction"]

_MIB = 1024**2


def _timed(fn: Callable[[], object], device: torch.device, group: dist.ProcessGroup) -> float:
    """Seconds of one ``fn()`` on the slowest rank (all ranks start together)."""
    dist.barrier(group=group)
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
    return float(elapsed.item())


def overlap_fraction(
    device: torch.device,
    group: dist.ProcessGroup,
    *,
    nbytes: int = 4 * _MIB,
    gemm_n: int | None = None,
    repeats: int = 9,
) -> dict[str, Any]:
    """Measure the fraction (module docstring); returns it with the times it came from."""
    n = gemm_n or (256 if device.type == "cpu" else 4096)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    buf = torch.ones(nbytes // 4, device=device, dtype=torch.float32)

    def reduce() -> None:
        dist.all_reduce(buf, group=group)

    def gemms(k: int) -> None:
        for _ in range(k):
            torch.mm(a, b)

    for _ in range(2):  # warm-up: connections, allocator, OpenMP/cuBLAS handles
        reduce()
        gemms(2)
    t_c = statistics.median(_timed(reduce, device, group) for _ in range(repeats))
    t_one = statistics.median(_timed(lambda: gemms(4), device, group) for _ in range(repeats)) / 4
    k = torch.tensor([max(1, round(t_c / max(t_one, 1e-9)))], dtype=torch.int64, device=device)
    dist.all_reduce(k, op=dist.ReduceOp.MAX, group=group)  # every rank runs the same number of GEMMs
    count = int(k.item())

    def both() -> None:
        work = dist.all_reduce(buf, group=group, async_op=True)
        gemms(count)
        assert work is not None
        work.wait()

    fractions, rows = [], []
    for _ in range(repeats):
        tc = _timed(reduce, device, group)
        tg = _timed(lambda: gemms(count), device, group)
        tb = _timed(both, device, group)
        fractions.append(min(1.0, max(0.0, (tc + tg - tb) / min(tc, tg))))
        rows.append({"collective_s": tc, "compute_s": tg, "both_s": tb})
    return {
        "dp_overlap_fraction": statistics.median(fractions),
        "nbytes": nbytes,
        "gemm_n": n,
        "gemms": count,
        "num_ranks": dist.get_world_size(group),
        "runs": rows,
    }
