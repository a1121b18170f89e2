"""Collective bandwidth over message sizes, reported as nccl-tests does (``doc/PERFORMANCE.md``).

``size`` is nccl-tests' buffer size: the all-reduced buffer, the gathered output of an all-gather, the input
of a reduce-scatter, the broadcast buffer, the message of a send/recv. ``algbw = size / time``;
``busbw = algbw x factor`` with the factors of PERFORMANCE.md, so that busbw compares with the link peak
whatever the rank count: all-reduce ``2(n-1)/n``, all-gather and reduce-scatter ``(n-1)/n``, broadcast and
send/recv 1. send/recv runs as nccl-tests' ``sendrecv``: every rank sends to the next and receives from the
previous at once.

Every rank times the same number of iterations (chosen from the warm-up on all ranks, so no rank waits in a
collective the others skip); the reported time is the slowest rank's mean, as nccl-tests reports it.

The whole sweep runs ``sweeps`` times (every op at every size, then again) and each size reports the median
sweep, all of them kept beside it (``sweeps_s``). One sweep is a short window on a shared machine: on 4 gloo
ranks of the 2-core VM the all-reduce alpha fitted to single sweeps (1 KiB-2 MiB) read 862-1174 us, the first
sweep of a launch low in each of three launches (984, 862, 933 against 989-1174 after it); the median of 5
sweeps read 1100-1157 us over the same three launches (2026-12-02). Full probes on 2 ranks: all-reduce alpha
627-879 us over three one-sweep probes (2026-12-01), 631-643 us over three of 3 sweeps (2026-12-02).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist

from autotune.probe.gemm import sync

__all__ = ["OPS", "BUSBW_FACTOR", "CollectiveResult", "message_sizes", "time_collective", "collective_sweep"]

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv")
BUSBW_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}
_KIB, _MIB = 1024, 1024**2


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveResult:
    op: str
    scope: str
    """``intra``: ranks of one node (every node at once); ``inter``: all ranks, across nodes."""
    num_ranks: int
    size_bytes: int
    time_s: float
    """The median sweep's seconds per op."""
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float
    sweeps_s: tuple[float, ...] = ()
    """Every sweep's seconds per op, in the order they ran."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def message_sizes(min_bytes: int = _KIB, max_bytes: int = 256 * _MIB) -> list[int]:
    """Doubling sizes from ``min_bytes`` to ``max_bytes`` (nccl-tests ``-b 1K -e 256M -f 2``)."""
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= 2
    return sizes


def _elems(size: int, n: int) -> int:
    """fp32 elements of a ``size``-byte buffer, rounded to a multiple of the rank count."""
    return max(n, size // 4 // n * n)


def _op(op: str, size: int, group: dist.ProcessGroup, device: torch.device):  # type: ignore[no-untyped-def]
    """A closure running one ``op`` of nccl-tests size ``size`` on ``group``."""
    n, me = dist.get_world_size(group), dist.get_rank(group)
    ranks = dist.get_process_group_ranks(group)
    elems = _elems(size, n)
    buf = torch.ones(elems, dtype=torch.float32, device=device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(buf, group=group)
    if op == "all_gather":
        part = buf[: elems // n].clone()
        return lambda: dist.all_gather_into_tensor(buf, part, group=group)
    if op == "reduce_scatter":
        part = buf[: elems // n].clone()
        return lambda: dist.reduce_scatter_tensor(part, buf, group=group)
    if op == "broadcast":
        return lambda: dist.broadcast(buf, src=ranks[0], group=group)
    if op == "send_recv":
        recv = torch.empty_like(buf)
        nxt, prev = ranks[(me + 1) % n], ranks[(me - 1) % n]

        def sendrecv() -> None:
            works = [dist.isend(buf, nxt, group=group), dist.irecv(recv, prev, group=group)]
            for w in works:
                w.wait()

        return sendrecv
    raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")


def _slowest(value: float, device: torch.device) -> float:
    """The maximum over ALL ranks (the world group), so every rank takes the same decision."""
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def time_collective(
    op: str,
    size: int,
    group: dist.ProcessGroup,
    device: torch.device,
    *,
    target_s: float = 0.05,
    max_iters: int = 50,
    warmup: int = 2,
) -> float:
    """Seconds per ``op`` of ``size`` bytes on ``group``: the slowest rank's mean over the timed loop."""
    run = _op(op, size, group, device)
    sync(device)
    start = time.perf_counter()
    for _ in range(warmup):
        run()
    sync(device)
    per_iter = _slowest((time.perf_counter() - start) / warmup, device)
    iters = int(min(max_iters, max(3, target_s / max(per_iter, 1e-9))))
    dist.barrier()
    sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        run()
    sync(device)
    return _slowest((time.perf_counter() - start) / iters, device)


def collective_sweep(
    device: torch.device,
    *,
    sizes: list[int],
    group: dist.ProcessGroup,
    scope: str,
    ops: tuple[str, ...] = OPS,
    target_s: float = 0.05,
    sweeps: int = 3,
) -> list[CollectiveResult]:
    """Every op at every size on ``group`` (the caller's rank must belong to it), ``sweeps`` times over; each
    size's median sweep (module docstring)."""
    if sweeps < 1:
        raise ValueError(f"sweeps must be at least 1, got {sweeps}")
    n = dist.get_world_size(group)
    ops = tuple(op for op in ops if op != "send_recv" or n >= 2)
    times: dict[tuple[str, int], list[float]] = {(op, size): [] for op in ops for size in sizes}
    for _ in range(sweeps):
        for op in ops:
            for size in sizes:
                times[op, size].append(time_collective(op, size, group, device, target_s=target_s))
    results = []
    for (op, size), runs in times.items():
        t = statistics.median(runs)
        nbytes = 4 * _elems(size, n)
        algbw = nbytes / t
        results.append(
            CollectiveResult(
                op=op,
                scope=scope,
                num_ranks=n,
                size_bytes=nbytes,
                time_s=t,
                algbw_bytes_per_s=algbw,
                busbw_bytes_per_s=algbw * BUSBW_FACTOR[op](n),
                sweeps_s=tuple(runs),
            )
        )
    return results
