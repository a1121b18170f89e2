"""The copies FSDP2 runs around its collectives on the compute stream: HBM traffic on the critical path.

FSDP2 (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py) all-gathers a unit's parameters into one
flat buffer and reduce-scatters its gradients out of one, so every collective has a copy beside it:

- after each all-gather, ``foreach_all_gather_copy_out`` splits the flat output into the unsharded parameters
  (``torch.ops.fsdp.split_with_sizes_copy``: read and write every gathered 16-bit element). It runs in
  ``FSDPParamGroup.wait_for_unshard`` (_fsdp_param_group.py), i.e. on the current (compute) stream, before
  the unit's forward or backward can start;
- before each reduce-scatter, ``foreach_reduce_scatter_copy_in`` packs the unsharded gradients into the
  reduce-scatter input (``torch._chunk_cat``), casting them to ``reduce_dtype`` (torchtitan's
  ``mixed_precision_reduce`` default ``float32``): read 2 B, write 4 B per element. The compute stream waits
  for it before freeing the gradients (``foreach_reduce``), so it is not hidden either.

The all-gather copy-in (the 1/N shard) and the sharded fp32 gradient update are N times smaller and not
counted. Convention: seconds per optimizer step on the busiest rank, at ``HBM_EFFICIENCY`` of the GPU's
bandwidth. Priced for framework ``fsdp`` with sharded parameters on a GPU with a known ``sm_count`` (never the
CPU trial device, whose measured host profile already holds its copies).
"""

from __future__ import annotations

from autotune.costmodel.dpcomm import GRAD_REDUCE_BYTES, PARAM_GATHER_BYTES, gathers_per_microbatch
from autotune.costmodel.kernels import HBM_EFFICIENCY
from autotune.costmodel.states import defers_grad_reduce
from autotune.plan import Framework, ParallelPlan, Sharding
from autotune.specs import ClusterSpec

__all__ = ["COPY_OUT_BYTES_PER_PARAM", "COPY_IN_BYTES_PER_PARAM", "collective_copies", "fsdp_copy_s"]

COPY_OUT_BYTES_PER_PARAM = 2 * PARAM_GATHER_BYTES
"""All-gather copy-out: read the flat 16-bit output, write the unsharded parameter."""
COPY_IN_BYTES_PER_PARAM = 2 + GRAD_REDUCE_BYTES["fsdp"]
"""Reduce-scatter copy-in: read the 16-bit gradient, write it in the fp32 ``reduce_dtype``."""


def collective_copies(plan: ParallelPlan) -> tuple[float, float]:
    """(all-gathers, reduce-scatters) of every unit per optimizer step: per micro-batch forward and backward
    gathers (one with ``reshard_after_forward=False``) and one reduce-scatter each; under pipelining
    ``m + 1`` gathers and one reduce per step (``dpcomm._pipelined_fsdp_comm``)."""
    m = plan.num_microbatches
    if defers_grad_reduce(plan):
        return (1.0 if plan.sharding is Sharding.FSDP_GRAD_OP else m + 1.0), 1.0
    return float(m * gathers_per_microbatch(plan)), float(m)


def fsdp_copy_s(cluster: ClusterSpec, plan: ParallelPlan, params: float) -> float:
    """Seconds per step of FSDP2's copy-out and copy-in kernels for the ``params`` (TP-sharded, unsharded
    over DP) parameters the busiest rank gathers; 0 where they are not priced (see the module docstring)."""
    if (
        plan.framework is not Framework.FSDP
        or not plan.params_sharded
        or plan.shard_degree * plan.cp <= 1
        or not cluster.gpu.sm_count
    ):
        return 0.0
    gathers, reduces = collective_copies(plan)
    traffic = params * (gathers * COPY_OUT_BYTES_PER_PARAM + reduces * COPY_IN_BYTES_PER_PARAM)
    return traffic / (cluster.gpu.memory_bandwidth_bytes_per_s * HBM_EFFICIENCY)
