"""Tensor-parallel collectives: how many a block issues per framework, and those of the embedding and LM head.

Megatron TP (Shoeybi et al. 2019 Sec. 3): a block's attention and MLP each end in a row-parallel GEMM whose
output is all-reduced in forward (with SP, Korthikanti et al. 2022 Sec. 4.2.2: reduce-scattered, and the
sub-layer input all-gathered, the same ring bytes), and each begins with column-parallel GEMMs whose input
gradient is all-reduced in backward. How many backward reductions a block pays depends on whether the
column-parallel projections of a sub-layer share one reduction:

- Megatron fuses Q/K/V and gate/up into one GEMM each: 2.
- torch DTensor TP with torchtitan's plan (``PrepareModuleInput`` hands the sub-layer one replicated DTensor,
  so the projections' partial gradients add up before one reduction): 2. autotune's trials use this plan;
  counted with ``CommDebugMode`` on them (tests/trials/test_tp_comm.py).
- DeepSpeed AutoTP wraps every column-parallel ``nn.Linear`` in its own ``LinearLayer`` whose backward
  all-reduces its input gradient (deepspeed/module_inject/layers.py ``ColumnParallel``): q, k, v and the MLP's
  input projections, 3 + (MLP matrices - 1).

The embedding and head (vocabulary-parallel, Narayanan et al. 2021 Sec. 3.1; torchtitan ``apply_tp``): the
embedding's output is all-reduced in forward (SP: reduce-scattered, its gradient all-gathered in backward);
the head's input gradient is all-reduced in backward (SP: the final norm's output all-gathered in forward,
its gradient reduce-scattered). The loss: Megatron's vocab-parallel cross-entropy all-reduces three ``b x s``
fp32 vectors (max, sum of exponentials, target logit; ``tensor_parallel/cross_entropy.py``); torch's plan as
autotune's trials run it gathers the logits (``ColwiseParallel(output_layouts=Replicate())``), ``b x s x V``
values. DeepSpeed AutoTP leaves the embedding and head whole (its Llama policy shards the blocks' linears
only); it broadcasts the micro-batch's inputs over the TP group (2 broadcasts) and issues one more
all-reduce of ``b x s x h`` size class in forward and one in backward. Counted per micro-batch on 2 gloo
ranks with ``CommDebugMode`` (``collective_calls``; tests/trials/test_tp_comm.py checks the two agree).

Sequence parallelism leaves one more reduction: each TP rank normalises only its sequence shard, so the norms'
weight (and bias) gradients are partial sums over the TP group (``sp_norm_grads``). Megatron-LM all-reduces
them once per step, coalesced (``finalize_model_grads``, ``_allreduce_layernorm_grads``); autotune's torch
trainer does the same where no data-parallel wrapper runs (``trials.train.reduce_partial_grads``); under
FSDP2 or ``replicate`` (DP > 1) FSDP2 all-reduces each such gradient over TP through DTensor, in every
micro-batch (counted: 9 per micro-batch on ``tiny`` at TP 2 x DP 2, tests/trials/test_tp_comm.py). The
other weights TP leaves whole see only the rank's sequence shard too and are reduced with them: MLA's down
projections and latent norms and the router (``states.tp_replicated_params``; Megatron marks them
``sequence_parallel``, torchtitan holds them as replicated DTensors).
"""

from __future__ import annotations

from autotune.costmodel import comm
from autotune.costmodel.states import layer_norm_params, tp_replicated_params
from autotune.modelshape import kv_replicas
from autotune.plan import Framework, ParallelPlan, Recompute
from autotune.specs import ClusterSpec, ModelSpec

__all__ = [
    "ACT_BYTES",
    "act_bytes",
    "LOSS_BYTES",
    "INPUT_BYTES",
    "NORM_GRAD_BYTES",
    "block_collectives",
    "collective_calls",
    "edge_collectives_s",
    "norm_grad_tensors",
    "reduction_s",
    "sp_norm_grads",
    "kv_replica_gather_s",
]

ACT_BYTES = 2
"""Bytes per activation element sent by TP/CP/PP collectives (bf16/fp16; fp8 recipes keep them 16-bit) on a
GPU; ``act_bytes`` gives the device's (``GPUSpec.half_bytes``: 4 on the CPU trial device)."""
LOSS_BYTES = 4
"""fp32 per-token values of a vocab-parallel cross-entropy."""
INPUT_BYTES = 8
"""int64 token ids (DeepSpeed AutoTP's input broadcast)."""
NORM_GRAD_BYTES = 4
"""fp32 norm gradients (Megatron reduces its fp32 ``main_grad``); their size hardly matters next to the
latency of the call."""


def act_bytes(cluster: ClusterSpec) -> int:
    """Bytes per activation element in this cluster's collectives (``ACT_BYTES`` on GPUs)."""
    return cluster.gpu.half_bytes


def block_collectives(model: ModelSpec, plan: ParallelPlan) -> tuple[int, int]:
    """``(forward, backward)`` TP collectives of one block per micro-batch (module docstring); a fully
    recomputed forward repeats the forward ones (counted in the first). A hybrid pattern's layer is one
    sub-layer (Mamba-2 ``in_proj`` / ``out_proj`` are column- / row-parallel as attention's): half."""
    if model.layer_pattern:  # one sub-layer per layer: one row-parallel output, one column-parallel input
        return (2 if plan.recompute is Recompute.FULL else 1), 1
    bwd = 3 + model.num_mlp_matrices - 1 if plan.framework is Framework.DEEPSPEED else 2
    fwd = 4 if plan.recompute is Recompute.FULL else 2
    return fwd, bwd


def collective_calls(model: ModelSpec, plan: ParallelPlan) -> tuple[int, int]:
    """``(forward, backward)`` TP collective calls of one micro-batch through a whole model (PP=1), as the
    framework issues them: with SP an all-reduce becomes an all-gather and a reduce-scatter (2 calls)."""
    if plan.tp <= 1:
        return 0, 0
    fwd, bwd = block_collectives(model, plan)
    per = 2 if plan.sequence_parallel and plan.framework is not Framework.DEEPSPEED else 1
    fwd, bwd = fwd * per * model.num_layers, bwd * per * model.num_layers
    if plan.framework is Framework.DEEPSPEED:
        return fwd + 1 + 2, bwd + 1
    loss = 3 if plan.framework is Framework.MEGATRON else 1
    if plan.sequence_parallel:  # embedding RS, head-input AG | embedding-grad AG, head-grad RS
        return fwd + 2 + loss, bwd + 2
    return fwd + 1 + loss, bwd + 1  # embedding AR | head-input-grad AR


def reduction_s(nbytes: float, plan: ParallelPlan, link: comm.GroupLink) -> float:
    """One TP reduction of an ``nbytes`` activation: an all-reduce, or with SP the all-gather and
    reduce-scatter pair that replaces it (the same ring bytes and steps on NCCL; each at its own measured
    latency and bandwidth where the profile has them, ``comm.GroupLink.of``). DeepSpeed AutoTP has no SP."""
    if plan.sequence_parallel and plan.framework is not Framework.DEEPSPEED:
        return comm.allgather_s(nbytes, plan.tp, link) + comm.reduce_scatter_s(nbytes, plan.tp, link)
    return comm.allreduce_s(nbytes, plan.tp, link)


def edge_collectives_s(
    model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, tokens: float
) -> tuple[float, float]:
    """Seconds per micro-batch of the TP collectives outside the blocks: ``(first pipeline rank: embedding,
    last pipeline rank: head and loss)`` for ``tokens`` tokens of one micro-batch on one rank."""
    tp = plan.tp
    if tp <= 1:
        return 0.0, 0.0
    link = comm.group_link(cluster, tp, 1)
    one = reduction_s(tokens * model.hidden_size * act_bytes(cluster), plan, link)
    if plan.framework is Framework.DEEPSPEED:
        broadcast = comm.allgather_s(tokens * INPUT_BYTES, tp, link)  # a ring broadcast: n-1 hops
        return one + 2 * broadcast, one
    if plan.framework is Framework.MEGATRON:
        return one, one + 3 * comm.allreduce_s(tokens * LOSS_BYTES, tp, link)
    return one, one + comm.allgather_s(tokens * model.vocab_size * act_bytes(cluster), tp, link)


def kv_replica_gather_s(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, tokens: float) -> float:
    """Seconds per block and micro-batch of Megatron's exchange for K/V heads held by several TP ranks
    (``modelshape.kv_replicas`` > 1): the fused QKV output of ``tokens`` tokens all-gathered over TP in
    forward (megatron-core 0.16.1 ``get_query_key_value_tensors``:
    ``all_gather_last_dim_from_tensor_parallel_region``) and its gradient reduce-scattered in backward, each
    between dependent kernels, so exposed;
    softmax-attention blocks only (a hybrid pattern's share); a fully recomputed forward gathers again."""
    if kv_replicas(model, plan.tp) == 1:
        return 0.0
    queries = model.num_heads * model.head_dim * (2 if model.attention_output_gate else 1)
    nbytes = tokens * (queries + 2 * model.kv_hidden_size) * act_bytes(cluster)
    link = comm.group_link(cluster, plan.tp, 1)
    forwards = 2 if plan.recompute is Recompute.FULL else 1
    gather, scatter = comm.allgather_s(nbytes, plan.tp, link), comm.reduce_scatter_s(nbytes, plan.tp, link)
    return model.softmax_share * (forwards * gather + scatter)


def norm_grad_tensors(model: ModelSpec, blocks: int, final_norm: bool) -> int:
    """Norm parameter tensors of ``blocks`` blocks (a norm per sub-layer) and, with ``final_norm``, the final
    norm: a weight per norm, and a bias with ``ModelSpec.bias`` (LayerNorm)."""
    return (2 if model.bias else 1) * (model.sublayers_per_layer * blocks + int(final_norm))


def sp_norm_grads(
    model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, blocks: int, final_norm: bool
) -> tuple[float, int]:
    """``(seconds, DTensor collective calls)`` per step of reducing the partial norm gradients of a pipeline
    rank with ``blocks`` blocks over TP under sequence parallelism (module docstring): one coalesced
    all-reduce per step, or under torch FSDP2 / ``replicate`` one per tensor per micro-batch."""
    if plan.tp <= 1 or not plan.sequence_parallel or plan.framework is Framework.DEEPSPEED:
        return 0.0, 0
    tensors = norm_grad_tensors(model, blocks, final_norm)
    nbytes: float = tensors * model.hidden_size * NORM_GRAD_BYTES
    if model.uses_mla or model.is_moe:  # MLA's down projections and latent norms, the routers
        nbytes += blocks * (tp_replicated_params(model) - layer_norm_params(model)) * NORM_GRAD_BYTES
        moe_blocks = round(blocks * len(model.moe_layers) / model.num_layers)
        tensors += blocks * (2 + 2 * bool(model.q_lora_rank)) * model.uses_mla + moe_blocks
    link = comm.group_link(cluster, plan.tp, 1)
    if plan.framework is Framework.FSDP and plan.dp > 1:
        calls = plan.num_microbatches * tensors
        return plan.num_microbatches * comm.allreduce_s(nbytes, plan.tp, link, calls=tensors), calls
    return comm.allreduce_s(nbytes, plan.tp, link), 0
