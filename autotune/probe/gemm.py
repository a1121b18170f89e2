"""GEMM throughput of the present device over shapes and dtypes (``torch.mm`` on preallocated operands).

Each shape is warmed up, then timed over enough iterations to pass ``min_time_s`` (CUDA: synchronised before
and after the loop). FLOPs of an ``m x k`` by ``k x n`` product are ``2 m n k``. Under torchrun every rank
runs the sweep at once, as the ranks of a trial share the node (on a CPU the cores are split between them).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["GemmResult", "default_shapes", "time_gemm", "gemm_sweep", "copy_bytes_per_s", "sync", "DTYPES"]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True, kw_only=True, slots=True)
class GemmResult:
    m: int
    n: int
    k: int
    dtype: str
    seconds: float
    """Mean seconds per product."""
    flops_per_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_shapes(device_type: str, *, quick: bool = False) -> list[tuple[int, int, int]]:
    """Squares, plus transformer-layer shapes (tokens x hidden x hidden / ffn) on a GPU."""
    if device_type == "cuda":
        squares = [1024, 2048, 4096] if quick else [1024, 2048, 4096, 8192]
        layers = [] if quick else [(8192, 4096, 4096), (8192, 14336, 4096), (8192, 4096, 14336)]
    else:
        squares = [128, 256, 512] if quick else [128, 256, 512, 1024, 2048]
        layers = [] if quick else [(2048, 256, 256), (2048, 688, 256), (2048, 256, 688)]
    return [(s, s, s) for s in squares] + layers


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (timers around CUDA kernels need it; a CPU op has finished)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_gemm(
    m: int, n: int, k: int, dtype: str, device: torch.device, *, min_time_s: float = 0.1, max_iters: int = 200
) -> GemmResult:
    """Seconds per ``m x k @ k x n`` product in ``dtype``, after two warm-up products."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(m, k, generator=gen).to(device=device, dtype=DTYPES[dtype])
    b = torch.randn(k, n, generator=gen).to(device=device, dtype=DTYPES[dtype])
    out = torch.empty(m, n, device=device, dtype=DTYPES[dtype])
    for _ in range(2):
        torch.mm(a, b, out=out)
    sync(device)
    iters, elapsed = 0, 0.0
    start = time.perf_counter()
    while elapsed < min_time_s and iters < max_iters:
        torch.mm(a, b, out=out)
        iters += 1
        if iters & (iters - 1) == 0 or iters % 128 == 0 or iters == max_iters:  # sync rarely
            sync(device)
            elapsed = time.perf_counter() - start
    sync(device)
    seconds = (time.perf_counter() - start) / iters
    return GemmResult(m=m, n=n, k=k, dtype=dtype, seconds=seconds, flops_per_s=2.0 * m * n * k / seconds)


def gemm_sweep(
    device: torch.device, *, dtypes: list[str], shapes: list[tuple[int, int, int]], min_time_s: float = 0.1
) -> list[GemmResult]:
    """Every shape in every dtype the device computes (a dtype that fails is skipped); with a process group,
    all ranks time each shape together, as trial ranks compute together."""
    # With a process group every rank times each shape over the same window (a barrier, then ``min_time_s``
    # whatever the iteration count), so ranks that share cores are measured sharing them, as they train.
    together = dist.is_initialized()
    results = []
    for dtype in dtypes:
        for m, n, k in shapes:
            if together:
                dist.barrier()
            try:
                results.append(
                    time_gemm(
                        m, n, k, dtype, device, min_time_s=min_time_s, max_iters=1 << 30 if together else 200
                    )
                )
            except RuntimeError:  # e.g. a dtype without a kernel on this device
                break
    return results


def copy_bytes_per_s(device: torch.device, *, nbytes: int, min_time_s: float = 0.1) -> float:
    """Achieved memory bandwidth of a device-to-device copy: ``2 x nbytes`` (read + write) per copy."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    iters, start = 0, time.perf_counter()
    while time.perf_counter() - start < min_time_s or iters < 3:
        dst.copy_(src)
        iters += 1
        sync(device)
    return 2.0 * nbytes * iters / (time.perf_counter() - start)
