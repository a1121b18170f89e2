"""How much communication hides behind compute: the overlap share and what it leaves exposed.

Split out of ``steptime`` so that ``blocktime`` (backward TP collectives under the weight-gradient GEMMs)
and ``steptime`` (DP/ZeRO/FSDP traffic and offload copies under each micro-batch) read one constant and
one rule.
"""

from __future__ import annotations

from autotune.specs import ClusterSpec

__all__ = ["DP_OVERLAP_FRACTION", "dp_overlap_fraction", "exposed_s"]

DP_OVERLAP_FRACTION = 0.8
"""Share of the overlappable compute window during which DP/ZeRO/FSDP collectives run hidden. Below 1 because
NCCL kernels take SMs and HBM bandwidth from the GEMMs they hide behind (PyTorch DDP paper, Li et al. 2020,
Sec. 5: overlap recovers most but not all communication time). The first gather / last reduce of a window is
always exposed (see ``exposed_s``)."""


def dp_overlap_fraction(cluster: ClusterSpec) -> float:
    """The cluster's calibrated overlap, else ``DP_OVERLAP_FRACTION``; 0 on a device whose frameworks issue
    collectives synchronously (``GPUSpec.async_collectives``)."""
    if not cluster.gpu.async_collectives:
        return 0.0
    return DP_OVERLAP_FRACTION if cluster.dp_overlap_fraction is None else cluster.dp_overlap_fraction


def exposed_s(
    comm_s: float, window_s: float, pieces: int, overlap_fraction: float = DP_OVERLAP_FRACTION
) -> float:
    """Communication left on the critical path when it may hide behind ``window_s`` of compute: at least one
    piece (the first gather / last reduce-scatter bucket of the window has nothing to overlap), else what
    ``DP_OVERLAP_FRACTION`` of the window cannot cover."""
    return max(comm_s / max(1, pieces), comm_s - overlap_fraction * window_s)
