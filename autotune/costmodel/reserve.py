"""Device memory outside the training step's tensors: the CUDA context, NCCL, and the allocator's slack.

Constants, mostly measured (benchmarks/results/memory_crosscheck_gpu.json), not a function of the model:
they live apart from the per-stage accounting of ``memory.py``, which adds them to every stage.
"""

from __future__ import annotations

from autotune.plan import ParallelPlan, Sharding
from autotune.specs import ClusterSpec

__all__ = [
    "reserve_bytes",
    "fragmentation_bytes",
    "CUDA_CONTEXT_BYTES",
    "NCCL_CONTEXT_BYTES",
    "NCCL_BYTES_PER_COMMUNICATOR",
    "FRAGMENTATION_FRACTION",
    "CPU_RESERVE_BYTES",
]

_MIB = 1024**2

CUDA_CONTEXT_BYTES = 685 * _MIB
"""CUDA context of a PyTorch process: device memory in use outside the caching allocator after the first
bf16 GEMM. Measured 718,077,952 B on an H200 with torch 2.11 + CUDA 13.0
(benchmarks/results/memory_crosscheck_gpu.json, ``context_bytes``)."""
NCCL_CONTEXT_BYTES = 558 * _MIB
"""NCCL's first communicator (its device code, proxy and buffers): measured 585,105,408 B for a 1-rank
communicator after one all-reduce on the same H200 (``nccl_world1_bytes``). Counted once when any
parallel axis is > 1."""
NCCL_BYTES_PER_COMMUNICATOR = 256 * _MIB
"""Peer buffers of each communicator (one per parallel axis of degree > 1): NCCL_BUFFSIZE 4 MiB x up to
32 channels x send/recv (NCCL environment-variable docs, NCCL_BUFFSIZE / NCCL_MAX_NCHANNELS). Not measured
here (one GPU); an estimate."""
FRAGMENTATION_FRACTION = 0.15
"""Caching-allocator slack (reserved - allocated at the peak) as a share of the bytes that come and go in
a step (activations, logits, gather buffers, step temporaries): 13-15% when activations dominate,
up to ~50% when the optimizer step's one large buffer does (benchmarks/results/memory_crosscheck_gpu.json,
H200). ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` removes most of it (PyTorch CUDA semantics
notes, "Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF")."""
CPU_RESERVE_BYTES = 64 * _MIB
"""CPU trials: gloo buffers and allocator slack; no device context exists (glibc malloc returns large
blocks to the system, so there is no caching-allocator fragmentation to speak of)."""


def reserve_bytes(cluster: ClusterSpec, plan: ParallelPlan) -> float:
    """CUDA context + NCCL (its first communicator, then one per parallel axis of degree > 1; HSDP has
    two); a small constant on CPU trials."""
    if cluster.gpu.key == "cpu":
        return float(CPU_RESERVE_BYTES)
    axes = sum(d > 1 for d in (plan.tp, plan.pp, plan.dp, plan.cp)) + (plan.sharding is Sharding.HSDP)
    nccl = (NCCL_CONTEXT_BYTES + axes * NCCL_BYTES_PER_COMMUNICATOR) if axes else 0.0
    return CUDA_CONTEXT_BYTES + nccl


def fragmentation_bytes(cluster: ClusterSpec, transient_bytes: float) -> float:
    """Caching-allocator slack on the bytes that come and go (``FRAGMENTATION_FRACTION``); none on CPU."""
    return 0.0 if cluster.gpu.key == "cpu" else FRAGMENTATION_FRACTION * transient_bytes
