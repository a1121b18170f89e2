"""Once-per-step passes of Megatron's DDP over its whole gradient buffer (not the optimizer shard).

Convention: seconds per optimizer step on the most-loaded GPU, HBM-bound, on the critical path (the
buffer is zeroed before the first forward; the check and the scaling run on the compute stream before each
bucket's reduce-scatter in the last backward).
"""

from __future__ import annotations

from autotune.costmodel.kernels import HBM_EFFICIENCY
from autotune.costmodel.states import megatron_grad_bytes
from autotune.plan import Framework, ParallelPlan
from autotune.specs import ClusterSpec

__all__ = ["GRAD_BUFFER_PASSES", "megatron_grad_buffer_s"]

GRAD_BUFFER_PASSES = 4
"""Element accesses per step of the ``main_grad`` buffer outside the GEMMs and the optimizer
(megatron/core/distributed/param_and_grad_buffer.py, core r0.7-r0.8): ``zero_grad_buffer``'s
``grad_data.zero_()`` (write 1); ``Bucket.start_grad_sync``: the NaN check ``grad_data.norm(p=2)`` under
``check_for_nan_in_grad`` (read 1; Megatron-LM's ``--check-for-nan-in-loss-and-grad`` is on by default) and
``grad_data *= gradient_scaling_factor`` (``1 / dp`` unless ``average_in_collective``: read 1, write 1)."""


def megatron_grad_buffer_s(cluster: ClusterSpec, plan: ParallelPlan, params: float) -> float:
    """Seconds of the ``GRAD_BUFFER_PASSES`` over the ``params`` gradient elements a Megatron rank holds,
    at the ``main_grad`` dtype's size (``states.megatron_grad_bytes``); the scaling only with DP > 1. 0 for
    other frameworks (FSDP2 and DeepSpeed reduce into fresh or bucketed buffers: not priced)."""
    if plan.framework is not Framework.MEGATRON or not cluster.gpu.memory_bandwidth_bytes_per_s:
        return 0.0
    passes = GRAD_BUFFER_PASSES - (2 if plan.dp * plan.cp == 1 else 0)
    hbm = cluster.gpu.memory_bandwidth_bytes_per_s * HBM_EFFICIENCY
    return passes * megatron_grad_bytes(plan) * params / hbm
