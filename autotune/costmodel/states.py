"""Model states per GPU: weights, gradients, optimizer states (gather buffers and buckets: ``dpbuffers``).

Convention: bytes on ONE rank of ONE pipeline stage (``first``/``last`` say which ends of the model it holds);
``memory.py`` evaluates the first and the last stage and keeps the larger.

Accounting follows ZeRO (Rajbhandari et al. 2020, Sec. 3.1): mixed-precision Adam keeps ``2 psi`` bf16
weights, ``2 psi`` bf16 gradients and ``K psi = 12 psi`` fp32 master weights, momentum and variance. fp8
training keeps bf16 weights here (Transformer Engine casts to fp8 per GEMM; the bf16 copy stays). Where a
framework stores something else, ``state_bytes_per_param`` says so with its source:

- DeepSpeed (bf16/fp16, ZeRO 0-3) also materialises an fp32 copy of the gradient partition in
  ``step()`` (stage_1_and_2.py / stage3.py ``single_grad_partition = ....to(fp32)``); its own estimator
  counts it: ``estimate_zero2_model_states_mem_needs`` "18 = 2_grads_16bit + 4_grads_32bit +
  4_params_32bit + 8_optimizer_states_32bit". We count it too (conservative: it lives during the step).
- Megatron keeps fp32 ``main_grad`` buffers (4 B), unsharded even with the distributed optimizer
  (megatron/training/theoretical_memory_usage.py: 18 B/param, or 6 + 12/d with the distributed optimizer);
  bf16 ones under fp8 (``megatron_grad_bytes``).
- FSDP2 with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` (autotune/trials/parallelize.py,
  torchtitan): the sharded parameter IS the fp32 master (4 B), sharded gradients are fp32 (4 B), Adam adds
  8 B; bf16 copies exist only unsharded (per unit in flight, or the whole stage for fsdp-grad-op, whose
  ``reshard_after_forward=False`` keeps every unit gathered from forward to backward). Sharding ``none``
  is DDP + bf16 autocast: fp32 params, grads and Adam, plus the bf16 weight casts saved for backward.
  ``plan.weight_dtype`` bf16 (a model built in bf16, as NeMo AutoModel's benchmark recipes build theirs:
  ``dtype=config.torch_dtype`` in its model classes) stores parameters and FSDP2's sharded gradients in
  2 B (FSDP2 casts the fp32 reduce-scatter output back to the parameter's dtype); the moments take
  ``plan.moment_dtype`` (``torch.optim.Adam`` allocates them like the parameter: 2 + 2 B).

Sharding: ZeRO-1 shards the optimizer, ZeRO-2/fsdp-grad-op also gradients, ZeRO-3/fsdp-full/hsdp also
parameters, over ``plan.shard_degree`` (DP, or the HSDP shard group) times CP (CP ranks hold the same
parameters; torchtitan and Megatron shard over ``dp x cp``). Offload (ZeRO-Offload, Ren et al. 2021)
moves optimizer states and master weights to the host; DeepSpeed and FSDP2 (``CPUOffloadPolicy``) move the
sharded gradients too, FSDP2 the sharded parameters as well. DeepSpeed ZeRO-1/2 with gradient accumulation
also keeps a 16-bit host gradient buffer (``host_grad_accumulation_bytes``).

Pipelining + FSDP2 (``defers_grad_reduce``): torch's pipeline stages accumulate unsharded gradients and keep
parameters gathered after backward until one reduction at the end of the step; ``memory.py`` adds those
buffers to its moments, ``dpbuffers.gathered_bytes`` only the per-unit gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.modelshape import mlp_part_params, routed_expert_params
from autotune.plan import Framework, GradDtype, ParallelPlan, Precision, Sharding, StoreDtype
from autotune.specs import ModelSpec

__all__ = [
    "Numerics",
    "MIXED_BF16",
    "FP32",
    "StateBytesPerParam",
    "ModelStates",
    "state_bytes_per_param",
    "model_state_bytes",
    "optimizer_step_temp_bytes",
    "state_shard_degree",
    "megatron_grad_bytes",
    "megatron_optimizer_bytes",
    "layer_params_per_gpu",
    "layer_norm_params",
    "router_params",
    "tp_replicated_params",
    "root_params_per_gpu",
    "stage_params_per_gpu",
    "vocab_split",
    "defers_grad_reduce",
    "host_grad_accumulation_bytes",
    "DEEPSPEED_SUB_GROUP_ELEMENTS",
]

DEEPSPEED_SUB_GROUP_ELEMENTS = 1_000_000_000
"""``zero_optimization.sub_group_size`` default (deepspeed/runtime/zero/config.py, 1e9): ZeRO-3 runs the
optimizer step on this many parameters at a time."""


_STORE_BYTES = {StoreDtype.FP32: 4.0, StoreDtype.BF16: 2.0}


@dataclass(frozen=True, kw_only=True, slots=True)
class Numerics:
    """Element sizes of one training recipe."""

    compute_bytes: int
    """Weights as the GEMMs read them, and activations: 2 (bf16/fp16) or 4 (fp32)."""
    mixed: bool
    """An fp32 master copy is kept apart from the compute weights (mixed precision)."""
    foreach_adamw: bool = False
    """The step is torch's multi-tensor AdamW (``foreach=True``, one fp32 temporary per parameter) rather
    than a fused kernel (torch ``fused=True``, DeepSpeed FusedAdam, Megatron/Apex: no temporary)."""


MIXED_BF16 = Numerics(compute_bytes=2, mixed=True)
"""bf16/fp16/fp8 plans (Micikevicius et al. 2018 mixed precision with fp32 master weights) with a fused
AdamW, as production trainers and autotune's GPU trials run it (autotune/trials/train.py)."""
FP32 = Numerics(compute_bytes=4, mixed=False, foreach_adamw=True)
"""Plain fp32 training (CPU trials, the measured cross-check): weights, gradients 4 B, Adam 8 B; the CPU
trials use foreach AdamW."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StateBytesPerParam:
    """Bytes per parameter, split by how each part is sharded."""

    weight: float
    """Persistent parameter storage (sharded by ZeRO-3 / fsdp-full / hsdp)."""
    unsharded_copy: float
    """Compute copy held gathered for the whole step (FSDP2 grad-op / DDP autocast); 0 otherwise."""
    grad: float
    """Gradient as accumulated (sharded by ZeRO-2 and up)."""
    grad_fp32_partition: float
    """fp32 gradient partition built for the step (DeepSpeed; sharded like the optimizer)."""
    optimizer: float
    """fp32 master (when separate) + Adam moments (sharded by ZeRO-1 and up)."""


def state_bytes_per_param(plan: ParallelPlan, numerics: Numerics) -> StateBytesPerParam:
    """Bytes per parameter of each model state (ZeRO paper Sec. 3.1: 2 + 2 + 12; framework notes in the
    module docstring)."""
    c = numerics.compute_bytes
    if not numerics.mixed:  # plain fp32 + Adam: 4 + 4 + 8, nothing else
        held = c if plan.framework is Framework.FSDP and plan.sharding is Sharding.FSDP_GRAD_OP else 0.0
        return StateBytesPerParam(
            weight=c, unsharded_copy=held, grad=c, grad_fp32_partition=0.0, optimizer=8.0
        )
    if plan.framework is Framework.FSDP:
        weight = _STORE_BYTES[plan.weight_dtype]
        autocast_copy = plan.sharding is Sharding.NONE and weight > c  # DDP + autocast casts fp32 weights
        held = c if plan.sharding is Sharding.FSDP_GRAD_OP or autocast_copy else 0.0
        return StateBytesPerParam(
            weight=weight,
            unsharded_copy=held,
            grad=weight,
            grad_fp32_partition=0.0,
            optimizer=2 * _STORE_BYTES[plan.moment_dtype],
        )
    if plan.framework is Framework.MEGATRON:
        return StateBytesPerParam(
            weight=c,
            unsharded_copy=0.0,
            grad=megatron_grad_bytes(plan),
            grad_fp32_partition=0.0,
            optimizer=megatron_optimizer_bytes(plan),
        )
    return StateBytesPerParam(weight=c, unsharded_copy=0.0, grad=c, grad_fp32_partition=4.0, optimizer=12.0)


def megatron_grad_bytes(plan: ParallelPlan) -> float:
    """Megatron's ``main_grad`` buffer element: fp32 for bf16/fp16 (megatron/training/arguments.py turns
    on ``accumulate_allreduce_grads_in_fp32`` under ``--bf16``; DDP's ``grad_reduce_in_fp32`` sizes the
    buffer in megatron/core/distributed/param_and_grad_buffer.py); bf16 for fp8 plans, as NeMo's and
    Megatron-Bridge's fp8 performance recipes set ``grad_reduce_in_fp32 = False`` (NeMo
    scripts/performance helpers: ``bf16_with_fp8_mixed()`` then ``grad_reduce_in_fp32 = False``) and the
    emitter writes ``--grad-reduce-in-bf16`` (autotune/emit/megatron.py). ``plan.grad_reduce_dtype`` sets it
    for any precision: Megatron-Bridge's performance recipes set ``cfg.ddp.grad_reduce_in_fp32 = False`` for
    bf16 too (scripts/performance/configs/gpt_oss/gpt_oss_llm_pretrain.py ``set_gpt_oss_common_configs``,
    configs/deepseek ``set_deepseek_v3_common_configs``)."""
    return 2.0 if plan.megatron_grad_dtype is GradDtype.BF16 else 4.0


def megatron_optimizer_bytes(plan: ParallelPlan) -> float:
    """Megatron's optimizer state per parameter: fp32 master + Adam moments, 12 B. With
    ``--use-precision-aware-optimizer`` and bf16 parameters Transformer Engine's ``FusedAdam`` keeps only the
    low 16 bits of each fp32 master weight (megatron/core/optimizer/optimizer_config.py
    ``store_param_remainders``, default True; transformer_engine/pytorch/optimizers/fused_adam.py
    ``_initialize_state(..., store_param_remainders)``): 2 + 8 = 10 B. Apex ``DistributedFusedAdam``, which
    NeMo 1.0 runs, does the same (nemo/collections/nlp/models/language_modeling/megatron_base_model.py sets
    ``store_param_remainders=True`` for a bf16 model with an fp32 optimizer). ``plan.adam_dtype`` bf16
    (``--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``, what Megatron-LM's MoE recipes and the MoE model zoo
    run; ``FusedAdam(exp_avg_dtype=, exp_avg_sq_dtype=)``) stores the moments in 2 B each: 2 + 4 = 6 B."""
    if not plan.precision_aware_optimizer or plan.precision is Precision.FP16:
        return 12.0
    return 2.0 + 2 * _STORE_BYTES[plan.moment_dtype]


def state_shard_degree(plan: ParallelPlan) -> int:
    """Ranks that split a sharded state: DP (or the HSDP shard group) x CP."""
    return plan.shard_degree * plan.cp


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelStates:
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    step_bytes: float
    """Temporaries of the optimizer step only (DeepSpeed's fp32 gradient partition, AdamW's foreach
    buffer)."""
    host_bytes: float
    """Offloaded bytes of this GPU (in host memory)."""


def model_state_bytes(
    num_params: float, plan: ParallelPlan, numerics: Numerics = MIXED_BF16, *, shard_degree: int | None = None
) -> ModelStates:
    """Weights, gradients and optimizer states of ``num_params`` parameters on one GPU.

    ZeRO Sec. 3.1/5: stage ``z`` divides the optimizer (z>=1), gradients (z>=2) and parameters (z=3) by
    the shard degree ``N_d`` (``state_shard_degree``, or ``shard_degree``: the expert-data-parallel group
    for routed experts, ``costmodel.moe``). Offload: optimizer (+ fp32 gradient partition, + sharded
    gradients for DeepSpeed/FSDP2, + sharded parameters for FSDP2) go to the host."""
    b = state_bytes_per_param(plan, numerics)
    degree = shard_degree if shard_degree is not None else state_shard_degree(plan)
    n = degree if plan.sharding is not Sharding.NONE else 1
    z = plan.zero_stage
    weight_sharded = z >= 3 or plan.sharding is Sharding.FSDP_GRAD_OP  # FSDP2 always shards the storage
    weight = num_params * b.weight / (n if weight_sharded else 1)
    held = num_params * b.unsharded_copy
    grad = num_params * b.grad / (n if z >= 2 else 1)
    opt_params = num_params / (n if z >= 1 else 1)
    optimizer = opt_params * b.optimizer
    if not plan.offload:
        fp32_grads = _step_group(opt_params, plan) * b.grad_fp32_partition
        step = optimizer_step_temp_bytes(opt_params, plan, numerics) + fp32_grads
        return ModelStates(
            weights_bytes=weight + held,
            gradients_bytes=grad,
            optimizer_bytes=optimizer,
            step_bytes=step,
            host_bytes=0.0,
        )
    host = (
        optimizer
        + opt_params * b.grad_fp32_partition
        + host_grad_accumulation_bytes(opt_params, plan, numerics)
    )
    if plan.framework is not Framework.MEGATRON and z >= 2:  # sharded gradients stream to the host
        # DeepSpeed ZeRO-2 reduces them straight into the fp32 host partition; ZeRO-3 also keeps its
        # bf16 gradient partition in pinned host memory (stage3.py ``grad_partitions_flat_buffer``).
        kept = 0.0 if plan.framework is Framework.DEEPSPEED and z == 2 else grad
        host, grad = host + kept, 0.0
    if plan.framework is Framework.FSDP and weight_sharded:  # CPUOffloadPolicy: sharded parameters too
        host, weight = host + weight, 0.0
    return ModelStates(
        weights_bytes=weight + held,
        gradients_bytes=grad,
        optimizer_bytes=0.0,
        step_bytes=0.0,
        host_bytes=host,
    )


def host_grad_accumulation_bytes(
    opt_params: float, plan: ParallelPlan, numerics: Numerics = MIXED_BF16
) -> float:
    """DeepSpeed ZeRO-1/2 ``offload_optimizer`` with gradient accumulation: a host buffer in the model dtype
    per parameter of the gradient partition, kept for the run (deepspeed/runtime/zero/stage_1_and_2.py
    ``async_accumulate_grad_in_cpu_via_gpu``: ``accumulated_grads_in_cpu[param_id] =
    torch.zeros(param.numel(), dtype=param.dtype, device=self.device)``, pinned; ``self.device`` is
    ``'cpu'`` under ``cpu_offload``). ``copy_grads_in_partition`` makes it when ``micro_step_id > 0 or not
    is_gradient_accumulation_boundary()``, i.e. with more than one micro-batch; ZeRO-1 reaches it at the
    boundary. autotune's ds_config leaves ``grad_accum_dtype`` unset (the model dtype), so
    ``_use_compact_grad_partition_buffer`` is False. Buffers are whole-parameter sized: a parameter straddling
    the partition edge adds its other part (not counted)."""
    deepspeed_zero12 = plan.framework is Framework.DEEPSPEED and plan.zero_stage in (1, 2)
    if not deepspeed_zero12 or plan.num_microbatches == 1:
        return 0.0
    return opt_params * numerics.compute_bytes


def defers_grad_reduce(plan: ParallelPlan) -> bool:
    """FSDP2/replicate stages under ``torch.distributed.pipelining`` reduce gradients once per step
    (torch/distributed/pipelining/stage.py: ``backward_maybe_with_nosync`` calls
    ``set_requires_gradient_sync(False)`` and ``set_reshard_after_backward(False)`` on the stage module,
    recursively, before every micro-batch's backward; ``perform_reduce_grad`` sets both back and runs each
    group's ``post_backward`` after the last one)."""
    return plan.framework is Framework.FSDP and plan.pp > 1


def _step_group(opt_params: float, plan: ParallelPlan) -> float:
    """Parameters one optimizer call updates: DeepSpeed ZeRO-3 steps ``sub_group_size`` at a time
    (stage3.py ``_prepare_fp32_grad_for_sub_group`` ... ``grad = None``), the others the whole shard."""
    if plan.framework is Framework.DEEPSPEED and plan.zero_stage == 3:
        return min(opt_params, DEEPSPEED_SUB_GROUP_ELEMENTS)
    return opt_params


def optimizer_step_temp_bytes(
    opt_params: float, plan: ParallelPlan, numerics: Numerics = MIXED_BF16
) -> float:
    """Temporary of the optimizer step: torch's multi-tensor AdamW (``foreach=True``, what
    autotune/trials/train.py builds on the CPU) allocates
    ``exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs)``, one fp32 tensor per parameter of the call
    (torch/optim/adam.py ``_multi_tensor_adam``). Megatron's fused Adam has none, nor has a fused torch
    AdamW (``numerics.foreach_adamw`` False); with offload the step runs on the host."""
    if plan.offload or plan.framework is Framework.MEGATRON or not numerics.foreach_adamw:
        return 0.0
    return _step_group(opt_params, plan) * 4.0


def layer_params_per_gpu(model: ModelSpec, plan: ParallelPlan) -> float:
    """Parameters of one transformer block on one TP rank (Megatron splits every matrix by ``t``) but those
    every TP rank holds whole (``tp_replicated_params``); routed experts are split over ``ep x etp`` instead
    (``costmodel.moe``; the mean block of an MoE model)."""
    experts, whole = model.expert_params_per_layer, tp_replicated_params(model)
    return (model.params_per_layer - experts - whole) / plan.tp + whole + experts / (plan.ep * plan.etp)


def router_params(model: ModelSpec) -> int:
    """One MoE layer's router: the ``E x h`` gate and the experts' score bias."""
    e = model.num_experts
    return model.hidden_size * e + (e if model.expert_bias else 0) if model.is_moe else 0


def tp_replicated_params(model: ModelSpec) -> float:
    """Parameters of the mean block that TP does not split: the norms (Megatron's and torch's TP split the
    weight matrices; a norm runs on the whole hidden width, or the sequence shard), MLA's down projections
    and latent norms (Megatron-Core ``linear_q_down_proj`` / ``linear_kv_down_proj`` built as TE
    ``parallel_mode="duplicated"``, multi_latent_attention.py; torchtitan deepseek_v3 ``wq_a``, ``wkv_a``,
    ``q_norm``, ``kv_norm`` as ``NoParallel``) and the router (Megatron's ``TopKRouter`` weight; torchtitan
    ``moe.router.gate`` ``NoParallel``)."""
    h = model.hidden_size
    mla = 0
    if model.uses_mla:
        r_q, r_kv = model.q_lora_rank or 0, model.kv_lora_rank
        mla = h * (r_q + r_kv + model.qk_rope_head_dim) + r_q + r_kv
    return layer_norm_params(model) + mla + len(model.moe_layers) / model.num_layers * router_params(model)


def layer_norm_params(model: ModelSpec) -> int:
    """The sub-layer norms of one block: a weight per norm, and a bias with ``ModelSpec.bias`` (LayerNorm)."""
    return model.num_layer_norms * model.hidden_size * (2 if model.bias else 1)


def vocab_split(plan: ParallelPlan) -> int:
    """TP ranks the ``V x h`` embedding and output layer are split over. Megatron and torch TP make them
    vocab-parallel (``VocabParallelEmbedding``; torchtitan's and the trials' ``RowwiseParallel`` embedding and
    ``ColwiseParallel`` head). DeepSpeed AutoTP shards the attention and MLP projections only and keeps both
    whole on every TP rank (deepspeed/module_inject/autotp_config.py, the ``llama`` preset); counted at TP 2
    x DP 2 under ZeRO-3, which all-gathers them at their full size (tests/trials/test_tp_comm.py)."""
    return 1 if plan.framework is Framework.DEEPSPEED else plan.tp


def root_params_per_gpu(model: ModelSpec, plan: ParallelPlan, *, first: bool, last: bool) -> float:
    """Embedding (first stage) and final norm + output layer (last stage) on one TP rank; vocab-parallel
    embeddings split ``V x h`` by ``t`` (``vocab_split``). Tied embeddings: with PP both ends hold a copy
    (Megatron ``share_embeddings_and_output_weights`` keeps one on each end and all-reduces its gradient)."""
    vh = model.vocab_size * model.hidden_size / vocab_split(plan)
    params = 0.0
    if first:
        params += vh + (model.max_seq_len * model.hidden_size if model.learned_positions else 0)
    if last:
        params += model.hidden_size * (2 if model.bias else 1)
        if not (first and model.tie_embeddings):
            params += vh
    return params


def stage_params_per_gpu(
    model: ModelSpec,
    plan: ParallelPlan,
    *,
    first: bool,
    last: bool,
    layers: float | None = None,
    moe_blocks: float | None = None,
) -> float:
    """Parameters one GPU of a stage holds before sharding: its blocks (``layers``, by default ``L/pp``;
    ``autotune/stagesplit.py`` for uneven splits) and its ends. ``moe_blocks``: how many of the blocks are
    MoE blocks (``stagestates.rank_moe_blocks``: DeepSeek-V3's first stage holds its 3 dense blocks), where
    the mean block would be off; None for the model's share."""
    n = model.num_layers / plan.pp if layers is None else layers
    blocks = n * layer_params_per_gpu(model, plan)
    if moe_blocks is not None:
        extra = mlp_params_per_gpu(model, plan, moe=True) - mlp_params_per_gpu(model, plan, moe=False)
        blocks += (moe_blocks - n * len(model.moe_layers) / model.num_layers) * extra
    return blocks + root_params_per_gpu(model, plan, first=first, last=last)


def mlp_params_per_gpu(model: ModelSpec, plan: ParallelPlan, *, moe: bool) -> float:
    """The MLP terms of an MoE or a dense block on one GPU: routed experts over ``ep x etp``, the rest
    over TP (``layer_params_per_gpu`` is their mean with the mixer)."""
    routed = routed_expert_params(model) if moe else 0
    router = router_params(model) if moe else 0  # whole on every TP rank (``tp_replicated_params``)
    split = mlp_part_params(model, moe=moe) - routed - router
    return split / plan.tp + router + routed / (plan.ep * plan.etp)
