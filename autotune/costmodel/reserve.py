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
    "nccl_bytes",
    "FRAGMENTATION_FRACTION",
    "CPU_RESERVE_BYTES",
]

_MIB = 1024**2

CUDA_CONTEXT_BYTES = 685 * _MIB
"""CUDA context of a PyTorch process: device memory in use outside the caching allocator after the first
bf16 GEMM. Measured 718,077,952 B on an H200 with torch 2.11 + CUDA 13.0
(benchmarks/results/memory_crosscheck_gpu.json, ``context_bytes``)."""
NCCL_CONTEXT_BYTES = 558 * _MIB
"""One NCCL communicator (its device code, proxy and buffers): measured 585,105,408 B for a 1-rank
communicator after one all-reduce on the same H200 (``nccl_world1_bytes``). Public measurements agree:
544 MB for a 2-rank and 688 MB for a 4-rank group on A100s over NVLink, each group after one all-reduce
(NVIDIA/nccl#964); 512 MiB of "NET shared P2P buffer" in a 1-rank communicator of NCCL 2.28 on B300s
(NVIDIA/nccl#2363), the bulk of the figure measured here. Every communicator a step uses costs this
(``nccl_bytes``)."""
NCCL_BYTES_PER_COMMUNICATOR = NCCL_CONTEXT_BYTES
"""What each communicator after the first costs: the measured one (``NCCL_CONTEXT_BYTES``)."""
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
    """CUDA context + NCCL (``nccl_bytes``); a small constant on CPU trials."""
    if cluster.gpu.key == "cpu":
        return float(CPU_RESERVE_BYTES)
    return CUDA_CONTEXT_BYTES + nccl_bytes(plan)


def nccl_bytes(plan: ParallelPlan) -> float:
    """NCCL's device memory on one GPU: a communicator per group that moves data, each as measured
    (``NCCL_CONTEXT_BYTES``): the world, each parallel axis of degree > 1, HSDP's second group, and with
    expert parallelism the experts' all-to-all group and their data-parallel group
    (``ParallelPlan.expert_shard_degree``, the group ``dpcomm`` reduces them over). None when every axis is
    1. Not priced: the send/receive buffers NCCL adds for each peer inside the NVLink domain of an
    all-to-all or a ring (docs/memory_headroom.md, item 4)."""
    expert_dp = plan.expert_shard_degree if plan.ep > 1 else 1
    axes = sum(d > 1 for d in (plan.tp, plan.pp, plan.dp, plan.cp, plan.ep, expert_dp))
    axes += plan.sharding is Sharding.HSDP
    return (NCCL_CONTEXT_BYTES + axes * NCCL_BYTES_PER_COMMUNICATOR) if axes else 0.0


def fragmentation_bytes(cluster: ClusterSpec, transient_bytes: float) -> float:
    """Caching-allocator slack on the bytes that come and go (``FRAGMENTATION_FRACTION``); none on CPU."""
    return 0.0 if cluster.gpu.key == "cpu" else FRAGMENTATION_FRACTION * transient_bytes
