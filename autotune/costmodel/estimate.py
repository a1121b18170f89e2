"""estimate(): ModelSpec + ClusterSpec + ParallelPlan -> Estimate (memory, step time, feasibility).

Feasibility is a value: an illegal or out-of-memory plan still gets its numbers and the reasons.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.costmodel.memory import MemoryBreakdown, memory_breakdown
from autotune.costmodel.steptime import TimeBreakdown, step_time
from autotune.pickled import by_values
from autotune.plan import ParallelPlan, check_plan
from autotune.specs import ClusterSpec, ModelSpec

__all__ = ["Estimate", "estimate", "fit_check"]

_GIB = 1024**3

_TIME_LABELS = {
    "compute_s": "compute",
    "recompute_s": "recompute",
    "tp_comm_s": "TP communication",
    "cp_comm_s": "CP communication",
    "pp_p2p_s": "PP send/recv",
    "pp_bubble_s": "pipeline bubble",
    "dp_comm_s": "DP/sharding communication",
    "optimizer_s": "optimizer step",
    "offload_s": "offload traffic",
    "overhead_s": "host overhead",
    "ep_comm_s": "EP all-to-all",
}


@by_values
@dataclass(frozen=True, kw_only=True, slots=True)
class Estimate:
    """The cost model's verdict on one plan."""

    plan: ParallelPlan
    feasible: bool
    reasons: tuple[str, ...]
    """Why the plan is infeasible (empty when feasible)."""
    memory: MemoryBreakdown
    memory_capacity_bytes: int
    time: TimeBreakdown
    num_gpus: int
    peak_flops_per_gpu: float

    @property
    def memory_bytes_per_gpu(self) -> float:
        """Predicted peak as the device shows it (allocator reserved + context)."""
        return self.memory.total_bytes

    @property
    def out_of_memory(self) -> bool:
        """The allocated peak alone exceeds the device (``MemoryBreakdown.needed_bytes``): the reserved
        peak may pass the capacity, as the allocator gives back its cached slack before it fails."""
        return self.memory.needed_bytes > self.memory_capacity_bytes

    @property
    def step_time_s(self) -> float:
        return self.time.step_time_s

    @property
    def tokens_per_s(self) -> float:
        return self.plan.tokens_per_step / self.step_time_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s / self.num_gpus

    @property
    def tflops_per_gpu(self) -> float:
        """Model TFLOP/s per GPU (no recompute counted)."""
        return self.time.model_flops / self.step_time_s / self.num_gpus / 1e12

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation, a fraction of the dense peak (0 when the peak is unknown)."""
        if not self.peak_flops_per_gpu:
            return 0.0
        return self.tflops_per_gpu * 1e12 / self.peak_flops_per_gpu

    @property
    def bottleneck(self) -> str:
        """What binds: memory when infeasible for memory, else the largest time term."""
        if self.out_of_memory:
            return "memory"
        terms = {k: v for k, v in self.time.as_dict().items() if k in _TIME_LABELS}
        return _TIME_LABELS[max(terms, key=terms.__getitem__)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "feasible": self.feasible,
            "reasons": list(self.reasons),
            "memory_bytes_per_gpu": self.memory_bytes_per_gpu,
            "memory_capacity_bytes": self.memory_capacity_bytes,
            "memory_breakdown": self.memory.as_dict(),
            "step_time_s": self.step_time_s,
            "time_breakdown": self.time.as_dict(),
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "mfu": self.mfu,
            "tflops_per_gpu": self.tflops_per_gpu,
            "bottleneck": self.bottleneck,
            "plan": self.plan.to_dict(),
        }


def fit_check(
    model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan
) -> tuple[MemoryBreakdown, tuple[str, ...]]:
    """``plan``'s memory and why it cannot run (illegal, out of GPU or host memory), without its step time:
    what a search needs of a plan that turns out not to fit (``autotune.rankworkers``)."""
    reasons = list(check_plan(plan, model, cluster))
    memory = memory_breakdown(model, cluster, plan)
    capacity = cluster.gpu.memory_bytes
    if memory.needed_bytes > capacity:
        reasons.append(
            f"out of memory: needs {memory.needed_bytes / _GIB:.1f} GiB per GPU allocated "
            f"({memory.total_bytes / _GIB:.1f} GiB with allocator slack) but "
            f"{cluster.gpu.key} has {capacity / _GIB:.1f} GiB"
        )
    host = cluster.host_memory_bytes_per_node
    if memory.host_bytes_per_node > host:
        reasons.append(
            f"out of host memory: offload needs {memory.host_bytes_per_node / _GIB:.0f} GiB per node "
            f"but a node has {host / _GIB:.0f} GiB"
        )
    return memory, tuple(reasons)


def estimate(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: ParallelPlan,
    *,
    checked: tuple[MemoryBreakdown, tuple[str, ...]] | None = None,
) -> Estimate:
    """Estimate memory and step time of ``plan``; never raises for an infeasible plan. ``checked``: this
    plan's ``fit_check``, when the caller has it already."""
    memory, reasons = checked if checked is not None else fit_check(model, cluster, plan)
    return Estimate(
        plan=plan,
        feasible=not reasons,
        reasons=reasons,
        memory=memory,
        memory_capacity_bytes=cluster.gpu.memory_bytes,
        time=step_time(model, cluster, plan),
        num_gpus=plan.world_size,
        peak_flops_per_gpu=cluster.gpu.peak_flops(str(plan.precision)) or 0.0,
    )
