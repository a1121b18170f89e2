"""What the GPU probes share: the device they run on (CUDA, or tiny shapes on the CPU under ``--dry-run``) and
how a call is timed (CUDA events, median of the timed repeats after warm-up)."""

from __future__ import annotations

import statistics
import sys
import time

import torch

CUDA = torch.cuda.is_available() and "--dry-run" not in sys.argv
DEV = "cuda" if CUDA else "cpu"
DT = torch.bfloat16
SCALE = 1 if CUDA else 64  # CPU dry run: every size / SCALE


def timed(fn, warmup: int = 2, iters: int = 5) -> float:
    """Median seconds of ``fn()`` (CUDA events on the GPU)."""
    for _ in range(warmup):
        fn()
    if not CUDA:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t
    torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(out)
