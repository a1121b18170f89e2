"""What pipelining + FSDP2 keeps unsharded on a stage until its end-of-step reduction (``KeptBytes``).

A separate concept from the model states (``states.py``) and the per-moment peaks (``memory.py``, which adds
these buffers to its moments): torch's pipeline stages defer FSDP2's reduce-scatter and reshard
(``states.defers_grad_reduce``).
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.costmodel.states import (
    MIXED_BF16,
    Numerics,
    defers_grad_reduce,
    layer_params_per_gpu,
    root_params_per_gpu,
    stage_params_per_gpu,
)
from autotune.plan import ParallelPlan, Sharding
from autotune.specs import ModelSpec

__all__ = ["KeptBytes", "deferred_reduce_bytes"]


@dataclass(frozen=True, kw_only=True, slots=True)
class KeptBytes:
    """Unsharded FSDP2 buffers a pipeline stage carries from micro-batch to micro-batch (all 0 without)."""

    params_bytes: float = 0.0
    """Compute-dtype parameters left gathered after a backward: the whole stage at its end (0 for
    fsdp-grad-op, whose gathered copy is counted with the weights)."""
    grads_bytes: float = 0.0
    """Unsharded gradients in the reduce dtype beyond the sharded ones ``model_state_bytes`` counts (those
    only exist after the end-of-step reduction)."""
    unit_grad_bytes: float = 0.0
    """Compute-dtype gradient of the largest unit, before ``accumulate_unsharded_grad_if_needed`` adds it."""
    reduce_input_bytes: float = 0.0
    """fp32 reduce-scatter input of the largest unit during the end-of-step reduction."""


def deferred_reduce_bytes(
    model: ModelSpec,
    plan: ParallelPlan,
    numerics: Numerics = MIXED_BF16,
    *,
    first: bool,
    last: bool,
    sharded_grad_bytes: float,
    layers: float | None = None,
) -> KeptBytes:
    """What torch 2.13's pipelining keeps unsharded on a sharded FSDP2 stage (``states.defers_grad_reduce``).

    torch/distributed/pipelining/stage.py ``backward_maybe_with_nosync`` turns off gradient sync and
    resharding after backward on every FSDP unit of the stage; in FSDP2's ``post_backward``
    (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py) a unit then neither reshards nor
    reduce-scatters, and ``FSDPParam.to_accumulated_grad_if_needed`` moves its gradient to an unsharded
    ``unsharded_accumulated_grad`` in ``reduce_dtype`` (fp32 under autotune/trials/parallelize.py's
    ``MixedPrecisionPolicy``; fp32 trials accumulate fp32 ``.grad``): 4 B per parameter of the stage until
    ``perform_reduce_grad``. ``foreach_reduce`` (``_fsdp_collectives.py``) copies a unit's gradients into its
    reduce-scatter input, then frees them. A unit gathered in backward stays gathered until its next forward
    reshards it (``reshard_after_forward=True``: fsdp-full, hsdp) or until the reduction (fsdp-grad-op)."""
    if not defers_grad_reduce(plan) or plan.sharding is Sharding.NONE:
        return KeptBytes()
    stage = stage_params_per_gpu(model, plan, first=first, last=last, layers=layers)
    unit = max(layer_params_per_gpu(model, plan), root_params_per_gpu(model, plan, first=first, last=last))
    params = 0.0 if plan.sharding is Sharding.FSDP_GRAD_OP else stage * numerics.compute_bytes
    return KeptBytes(
        params_bytes=params,
        grads_bytes=max(0.0, 4.0 * stage - sharded_grad_bytes),
        unit_grad_bytes=unit * numerics.compute_bytes,
        reduce_input_bytes=4.0 * unit,
    )
