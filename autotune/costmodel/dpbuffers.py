"""Data-parallel buffers outside the model states: ZeRO-3/FSDP gathered units and gradient buckets.

Split out of ``states.py`` (whose per-GPU parameter counts and gradient dtypes they use): these buffers come
and go during a step, so ``memory.py`` adds them to its moments rather than to the persistent states.
Convention as in ``states.py``: bytes on ONE rank of ONE pipeline stage.
"""

from __future__ import annotations

from autotune.costmodel.states import (
    MIXED_BF16,
    Numerics,
    defers_grad_reduce,
    layer_params_per_gpu,
    megatron_grad_bytes,
    root_params_per_gpu,
    vocab_split,
)
from autotune.plan import Framework, ParallelPlan, Sharding
from autotune.specs import ModelSpec

__all__ = [
    "largest_module_params_per_gpu",
    "gathered_bytes",
    "comm_bucket_bytes",
    "DDP_BUCKET_BYTES",
    "DEEPSPEED_REDUCE_BUCKET_ELEMENTS",
    "DEEPSPEED_ALLREDUCE_BUCKET_ELEMENTS",
    "DEEPSPEED_PREFETCH_BUCKET_ELEMENTS",
    "DEEPSPEED_OVERLAP_COMM",
]

DDP_BUCKET_BYTES = 25 * 1024**2
"""torch DDP ``bucket_cap_mb=25`` (torch/nn/parallel/distributed.py). With ``gradient_as_bucket_view=True``
the buckets are the gradients themselves; one bucket in flight is counted as staging."""
DEEPSPEED_REDUCE_BUCKET_ELEMENTS = 500_000_000
"""``zero_optimization.reduce_bucket_size`` default (deepspeed/runtime/zero/config.py, 5e8 elements): the
ZeRO-1/2 ``ipg_buffer`` and the ZeRO-3 ``__ipg_bucket_flat_buffer`` (bf16). autotune's ds_config leaves it
at DeepSpeed's default; an emitter that lowers it must lower this too."""
DEEPSPEED_OVERLAP_COMM = True
"""autotune's ds_config sets ``overlap_comm: true`` for ZeRO >= 1 (autotune/emit/deepspeed.py)."""
DEEPSPEED_ALLREDUCE_BUCKET_ELEMENTS = 500_000_000
"""``allreduce_bucket_size`` default (deepspeed/runtime/constants.py, 5e8): ZeRO-0 flattens gradients into
buckets of this many elements for the all-reduce."""
DEEPSPEED_PREFETCH_BUCKET_ELEMENTS = 50_000_000
"""``stage3_prefetch_bucket_size`` default (deepspeed/runtime/zero/config.py, 5e7 elements): parameters
ZeRO-3 all-gathers ahead of the module that runs."""


def largest_module_params_per_gpu(model: ModelSpec, plan: ParallelPlan, *, first: bool, last: bool) -> float:
    """Largest leaf module (DeepSpeed ZeRO-3 gathers per ``nn.Module``; its estimator's
    ``largest_layer_params``): an MLP matrix ``h x ffn``, Q/O ``h x h``, or the vocab matrix on an end."""
    h = model.hidden_size
    candidates = [h * model.ffn_hidden_size / plan.tp, h * h / plan.tp]
    if first or last:
        candidates.append(model.vocab_size * h / vocab_split(plan))
    return max(candidates)


def gathered_bytes(
    model: ModelSpec,
    plan: ParallelPlan,
    numerics: Numerics = MIXED_BF16,
    *,
    first: bool,
    last: bool,
    backward: bool,
) -> float:
    """Unsharded parameter/gradient buffers in flight (ZeRO-3 / FSDP), in backward or at the loss.

    FSDP2 (a unit per block and per end, as autotune/trials/parallelize.py and torchtitan wrap them;
    measured with FSDPMemTracker, benchmarks/memory_crosscheck.py): nothing stays gathered at the loss; in a
    block's backward the current and the prefetched block are gathered and one block's unsharded gradient
    waits for its reduce-scatter (in ``reduce_dtype`` fp32); the ends' own backwards are
    ``end_backward_bytes``. Megatron-FSDP and pipelining + FSDP2 keep the root unit's pricing (the ends
    gathered through the whole backward). fsdp-grad-op holds every unit gathered already
    (``state_bytes_per_param.unsharded_copy``), so only the gradient remains. With pipelining
    (``defers_grad_reduce``) no unit reduces in backward: its compute-dtype gradient waits to be added to the
    accumulated one (torch/distributed/fsdp/_fully_shard/_fsdp_param.py
    ``accumulate_unsharded_grad_if_needed``); what stays gathered is ``memory.py``'s. DeepSpeed ZeRO-3
    gathers per leaf module: the largest module's parameter and gradient (its estimator's
    ``4 x largest_layer_params``) plus the prefetch bucket. Megatron-FSDP (megatron/core/distributed/fsdp/
    ``MegatronFSDP``: a unit per transformer layer, the current one gathered and the next prefetched, the
    unsharded gradient reduce-scattered per unit) is priced like FSDP2 with Megatron's gradient dtype."""
    c = numerics.compute_bytes
    if plan.framework is Framework.DEEPSPEED and plan.zero_stage == 3:
        module = largest_module_params_per_gpu(model, plan, first=first, last=last)
        return module * 2 * c + DEEPSPEED_PREFETCH_BUCKET_ELEMENTS * c
    megatron_fsdp = plan.framework is Framework.MEGATRON and plan.sharding is Sharding.FSDP_FULL
    if not megatron_fsdp and (plan.framework is not Framework.FSDP or plan.sharding is Sharding.NONE):
        return 0.0
    layer = layer_params_per_gpu(model, plan)
    root = root_params_per_gpu(model, plan, first=first, last=last)
    grad_element_bytes = c if defers_grad_reduce(plan) else 4.0
    if megatron_fsdp:  # units per layer, double-buffered gathers (megatron_fsdp ``fsdp_double_buffer``)
        grad_element_bytes = megatron_grad_bytes(plan)
    grad = max(layer, root) * grad_element_bytes if backward else 0.0
    if megatron_fsdp or defers_grad_reduce(plan):
        if plan.sharding is Sharding.FSDP_GRAD_OP:
            return grad
        return (root + 2 * layer) * c + grad if backward else 0.0
    # FSDP2 with the ends as their own units (autotune/trials/parallelize.py ``end_units``, torchtitan):
    # a block's backward holds it and the next gathered and its gradient; the ends' own backwards are
    # ``end_backward_bytes``
    if not backward:
        return 0.0
    gathered = 0.0 if plan.sharding is Sharding.FSDP_GRAD_OP else 2 * c
    return gathered * layer + layer * grad_element_bytes


def end_backward_bytes(
    model: ModelSpec, plan: ParallelPlan, numerics: Numerics = MIXED_BF16, *, first: bool, last: bool
) -> tuple[float, float]:
    """FSDP2 buffers while an end unit runs its backward, (embeddings, head), measured per category with
    FSDPMemTracker at Llama 3 8B's width and vocabulary (benchmarks/memory_crosscheck.py, "wide" cases):

    - the head: gathered again (under fsdp-grad-op it stayed gathered, counted with the weights), the
      forward's last all-gather output, which FSDP2 frees only at the next forward's copy-out
      (``FSDPParamGroup.wait_for_unshard``), and its gradient's reduce-scatter input in ``reduce_dtype``
      fp32;
    - the embeddings, the step's last backward: the same (the head's all-gather output still lingers);
    - tied embeddings (one unit holding both ends): at the embeddings' backward autograd holds the head's
      gradient of the shared weight, the embeddings' and their sum beside the gathered unit (fsdp-full:
      4 unit-sized buffers; fsdp-grad-op, gathered all along: 2 beyond the weights), and the first block's
      reduce-scatter is still in flight.

    0 for other frameworks and for pipelining + FSDP2 (``gathered_bytes``)."""
    if plan.framework is not Framework.FSDP or plan.sharding is Sharding.NONE or defers_grad_reduce(plan):
        return 0.0, 0.0
    c, grad_op = numerics.compute_bytes, plan.sharding is Sharding.FSDP_GRAD_OP
    embed, head = end_unit_params(model, plan, first=first, last=last)
    block_reduce = layer_params_per_gpu(model, plan) * 4.0
    gathered = c if grad_op else 2 * c
    if first and last and model.tie_embeddings:  # one unit: the head's backward, then the shared gradients'
        return head * (2 if grad_op else 4) * c + block_reduce, head * (gathered + 4.0)
    return embed * (gathered + 4.0), head * (gathered + 4.0)


def end_unit_params(model: ModelSpec, plan: ParallelPlan, *, first: bool, last: bool) -> tuple[float, float]:
    """Parameters of one rank's two end units, (embeddings, final norm + head), as
    ``trials.parallelize.end_units`` groups them: tied embeddings on a stage that holds both ends are one
    unit, counted as the head's."""
    embed = root_params_per_gpu(model, plan, first=first, last=False)
    both = root_params_per_gpu(model, plan, first=first, last=last)
    if first and last and model.tie_embeddings:
        return 0.0, both
    return embed, both - embed


def comm_bucket_bytes(plan: ParallelPlan, stage_params: float, numerics: Numerics = MIXED_BF16) -> float:
    """Gradient buckets outside the model states. DeepSpeed ZeRO-1/2/3 allocate flat ``reduce_bucket_size``
    buffers whatever the model size (stage_1_and_2.py ``setup_buckets``: a second one with
    ``overlap_comm``, which autotune's ds_config sets; stage3.py one per dtype); ZeRO-0 flattens gradients
    into all-reduce buckets. torch DDP: one 25 MiB bucket in flight. Megatron's buckets are views into its
    ``main_grad`` buffer and FSDP2's reduce-scatter input is counted in ``gathered_bytes``: nothing here."""
    c = numerics.compute_bytes
    if plan.dp * plan.cp == 1:
        return 0.0
    if plan.framework is Framework.DEEPSPEED:
        if plan.zero_stage == 0:
            return min(DEEPSPEED_ALLREDUCE_BUCKET_ELEMENTS, stage_params) * c
        buffers = 2 if plan.zero_stage < 3 and DEEPSPEED_OVERLAP_COMM else 1
        return buffers * DEEPSPEED_REDUCE_BUCKET_ELEMENTS * c
    if plan.framework is Framework.FSDP and plan.sharding is Sharding.NONE:
        return min(DDP_BUCKET_BYTES, stage_params * 4.0)
    return 0.0
