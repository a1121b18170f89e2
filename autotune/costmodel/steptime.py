"""Time of one optimizer step. INTERFACE ONLY: being implemented."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from autotune.plan import ParallelPlan
from autotune.specs import ClusterSpec, ModelSpec

__all__ = ["TimeBreakdown", "step_time"]


@dataclass(frozen=True, kw_only=True, slots=True)
class TimeBreakdown:
    """Seconds per optimizer step on the critical path, by cause. ``step_time_s`` is their sum."""

    compute_s: float
    """Forward + backward GEMMs and attention of all micro-batches on one stage (no recompute)."""
    recompute_s: float
    """Extra forward work of activation recomputation."""
    tp_comm_s: float
    """Exposed TP all-reduce / all-gather + reduce-scatter (with SP)."""
    cp_comm_s: float
    """Exposed context-parallel K/V exchange."""
    pp_p2p_s: float
    """Pipeline point-to-point activation/gradient sends on the critical path."""
    pp_bubble_s: float
    """Pipeline fill/drain idle time."""
    dp_comm_s: float
    """Exposed (not overlapped with backward) DP all-reduce / ZeRO/FSDP gathers and reduce-scatters."""
    optimizer_s: float
    """Optimizer step (memory-bound) on GPU or host."""
    offload_s: float
    """Exposed host<->device traffic of optimizer offload."""
    model_flops: float
    """Model FLOPs per step over all GPUs (6N-style + attention, no recompute): the MFU numerator."""
    hardware_flops: float
    """FLOPs actually executed per step over all GPUs (with recompute): the HFU numerator."""
    dp_comm_total_s: float = 0.0
    """DP communication including the part hidden behind backward (for reports)."""

    @property
    def step_time_s(self) -> float:
        return (self.compute_s + self.recompute_s + self.tp_comm_s + self.cp_comm_s + self.pp_p2p_s
                + self.pp_bubble_s + self.dp_comm_s + self.optimizer_s + self.offload_s)

    def as_dict(self) -> dict[str, float]:
        d = asdict(self)
        d["step_time_s"] = self.step_time_s
        return d


def step_time(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan) -> TimeBreakdown:
    raise NotImplementedError
