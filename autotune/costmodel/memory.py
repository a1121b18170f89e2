"""Per-GPU memory of one training step (worst rank). INTERFACE ONLY: being implemented."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from autotune.plan import ParallelPlan
from autotune.specs import ClusterSpec, ModelSpec

__all__ = ["MemoryBreakdown", "memory_breakdown"]


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryBreakdown:
    """Bytes on the most-loaded GPU, by what they hold."""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    """fp32 master weights + Adam moments kept on the GPU (0 when offloaded)."""
    activations_bytes: float
    """Activations of all in-flight micro-batches on the worst stage."""
    logits_bytes: float
    """fp32 logits / loss buffers on the stage that holds the output layer."""
    prefetch_bytes: float
    """ZeRO-3/FSDP all-gathered (unsharded) parameter and gradient buffers in flight."""
    comm_buffer_bytes: float
    """DDP/ZeRO gradient buckets and other communication staging."""
    reserve_bytes: float
    """CUDA context, NCCL, allocator fragmentation: documented constants."""
    host_bytes_per_node: float = 0.0
    """Host memory the offloaded optimizer needs on one node."""

    @property
    def total_bytes(self) -> float:
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.activations_bytes
                + self.logits_bytes + self.prefetch_bytes + self.comm_buffer_bytes + self.reserve_bytes)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def memory_breakdown(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan) -> MemoryBreakdown:
    raise NotImplementedError
