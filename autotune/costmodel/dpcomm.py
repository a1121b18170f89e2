"""DP/ZeRO/FSDP communication of one optimizer step: which collectives a data-parallel group issues, how
many calls they take, and what each can hide behind (``DpComm``); ``steptime.step_time`` overlaps them.

Times come from ``comm`` (alpha-beta, nccl-tests bus-bandwidth factors); the group is ``dp x cp`` ranks at
stride ``tp`` (rank order pp, dp, cp, tp; ``autotune.plan``). Megatron's routed experts are reduced and
gathered over their own expert-data-parallel group instead (``expert_dp_split``).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

from autotune.costmodel import comm, moe
from autotune.costmodel.dpbuffers import DEEPSPEED_PREFETCH_BUCKET_ELEMENTS, DEEPSPEED_REDUCE_BUCKET_ELEMENTS
from autotune.costmodel.states import defers_grad_reduce, megatron_grad_bytes
from autotune.plan import Framework, ParallelPlan, Sharding
from autotune.specs import ClusterSpec, ModelSpec

__all__ = [
    "DpComm",
    "Zero3Gathers",
    "collective_calls",
    "dp_comm_s",
    "gathers_per_microbatch",
    "zero3_gathers",
    "GRAD_REDUCE_BYTES",
    "PARAM_GATHER_BYTES",
    "MEGATRON_BUCKET_ELEMENTS",
    "MEGATRON_BUCKET_ELEMENTS_PER_RANK",
    "megatron_bucket_elements",
    "expert_dp_split",
    "DEEPSPEED_EXPOSED",
]

DEEPSPEED_MAX_REUSE_ELEMENTS = 1_000_000_000
"""DeepSpeed ZeRO-3 ``stage3_max_reuse_distance`` (and ``stage3_max_live_parameters``), default 1e9
elements: a fetched parameter is not released if it will be used again within that many fetched elements
(deepspeed/runtime/zero/partitioned_param_coordinator.py ``release_sub_module``). A rank whose fetched
parameters are under it keeps what its forward gathered for the backward of the same micro-batch; the next
micro-batch gathers them again (counted, ``zero3_gathers``)."""
DEEPSPEED_PERSISTENCE_ELEMENTS = 100_000
"""``stage3_param_persistence_threshold`` default (deepspeed/runtime/zero/config.py, 1e5 elements): a
parameter of at most this many elements stays gathered (``ds_persist``, parameter_offload.py
``mark_persistent_parameters``), so no forward fetches it; after every optimizer step the engine all-gathers
each one again (stage3.py ``_post_step`` -> partition_parameters.py ``_allgather_params_coalesced``, which
issues one ``all_gather_into_tensor`` per parameter) with no compute left to hide behind."""
DEEPSPEED_BUCKET_ALLREDUCE = True
"""DeepSpeed ZeRO-1/2 reduce each gradient bucket with an all-reduce, not a reduce-scatter:
``zero_optimization.use_multi_rank_bucket_allreduce`` defaults to true (deepspeed/runtime/zero/
stage_1_and_2.py ``average_tensor``), and each rank then keeps its partition of the reduced bucket; the
updated partitions are all-gathered after the step. Counted on 2 gloo ranks: ZeRO-1 issues all-reduces and
one all-gather per step, no reduce-scatter (tests/trials/test_tp_comm.py)."""
DEEPSPEED_EXPOSED = True
"""DeepSpeed's engine reduces ZeRO-0 and ZeRO-1 gradients at the accumulation boundary, after the last
backward (deepspeed/runtime/engine.py ``allreduce_gradients``: ``buffered_allreduce_fallback`` for ZeRO-0,
``optimizer.reduce_gradients`` for ZeRO-1; only ZeRO-2/3 reduce in backward hooks, ``overlap_comm``), and
ZeRO-1/2 all-gather the updated partitions inside ``optimizer.step`` (stage_1_and_2.py
``all_gather_dp_groups``): both sit on the critical path (``DpComm.tail_s``)."""
MEGATRON_BUCKET_ELEMENTS = 40_000_000
"""Megatron-LM's smallest default gradient bucket: ``DistributedDataParallelConfig.bucket_size`` defaults to
``max(40_000_000, 1_000_000 * dp_cp)`` elements, "larger DP sizes need larger buckets to ensure collectives do
not become latency-bound" (megatron/core/distributed/distributed_data_parallel_config.py ``bucket_size``;
megatron/training/training.py ``resolve_ddp_bucket_size``, over the DP x CP group):
``megatron_bucket_elements``."""
MEGATRON_BUCKET_ELEMENTS_PER_RANK = 1_000_000
"""The per-rank part of Megatron's default bucket (``1_000_000 * dp_cp``, above)."""
PARAM_GATHER_BYTES = 2
"""Bytes per parameter of ZeRO/FSDP all-gathers (16-bit compute weights; ``GPUSpec.half_bytes`` on a device
that runs 16-bit plans wider)."""
GRAD_REDUCE_BYTES = {"megatron": 4, "fsdp": 4, "deepspeed": 2}
"""Bytes per gradient element reduced over DP: Megatron reduces its ``main_grad`` buffer (fp32, or bf16 with
``--grad-reduce-in-bf16``: ``states.megatron_grad_bytes``, which ``dp_comm`` uses); torchtitan's
FSDP2 policy uses ``reduce_dtype=float32``; DeepSpeed's ``communication_data_type`` defaults to the 16-bit
model dtype."""


class DpComm(NamedTuple):
    """Seconds of DP/ZeRO/FSDP collectives per optimizer step, by what they can hide behind."""

    per_microbatch_s: float
    """Issued in every micro-batch; hides behind that micro-batch's compute."""
    once_s: float
    """Once per step, overlapping one micro-batch's compute (bucketed reduction in the last backward)."""
    tail_s: float
    """Once per step with no compute left to hide behind (pipelining's end-of-step FSDP2 reduction)."""


class Zero3Gathers(NamedTuple):
    """How DeepSpeed ZeRO-3 all-gathers one rank's parameters (``zero3_gathers``)."""

    modules: int
    """Modules that hold parameters (each runs the fetch / release hooks)."""
    persistent: int
    """Parameters kept gathered (``DEEPSPEED_PERSISTENCE_ELEMENTS``): one all-gather each per step."""
    persistent_params: float
    fetched_params: float
    """The rest: all-gathered in every micro-batch's forward."""
    fetch_calls: int
    """Coalesced all-gathers of ``fetched_params`` per forward: the prefetcher batches the parameters of the
    modules ahead, up to ``DEEPSPEED_PREFETCH_BUCKET_ELEMENTS``, into one ``all_gather_coalesced``."""


@functools.cache  # a step estimate asks up to three times; the search estimates thousands of plans
def zero3_gathers(model: ModelSpec, tp: int) -> Zero3Gathers:
    """DeepSpeed ZeRO-3's all-gathers of a rank that holds the whole model split over ``tp`` (ZeRO-3 runs
    without pipelining: ``plan.check``). Its parameters, module by module: Q, K, V, O and the MLP matrices
    split over TP, the norms, embedding and head whole (AutoTP: ``states.vocab_split``). Counted with
    ``CommDebugMode`` on 2 gloo ranks (tests/trials/test_tp_comm.py): ``tiny`` (every block parameter under
    the threshold) 37 persistent gathers + 1 coalesced gather of the embedding and head per micro-batch;
    ``small`` (its MLP matrices over it) 49 + 1 of 6.3 M elements per micro-batch; at TP 2 x DP 2 (4 ranks)
    ``tiny`` 37 + 1 of the whole embedding and head, ``small`` 73 (its halved MLP matrices now under the
    threshold) + 1."""
    h, kv, f, v = model.hidden_size, model.kv_hidden_size, model.ffn_hidden_size, model.vocab_size
    norm = [h] * (2 if model.bias else 1)
    mlp_biases = [f // tp] * (model.num_mlp_matrices - 1)
    bias = [h // tp, kv // tp, kv // tp, h, *mlp_biases, h] if model.bias else []
    block = [
        h * h // tp,
        h * kv // tp,
        h * kv // tp,
        h * h // tp,
        *([h * f // tp] * model.num_mlp_matrices),
        *norm,
        *norm,
        *bias,
    ]
    first = [v * h, *([model.max_seq_len * h] if model.learned_positions else [])]
    last = [*norm, *([] if model.tie_embeddings else [v * h])]
    sizes = first + model.num_layers * block + last  # in the order forward fetches them
    kept = [n for n in sizes if n <= DEEPSPEED_PERSISTENCE_ELEMENTS]
    fetched = [n for n in sizes if n > DEEPSPEED_PERSISTENCE_ELEMENTS]
    modules = model.num_layers * (4 + model.num_mlp_matrices + 2) + (2 if model.tie_embeddings else 3)
    return Zero3Gathers(
        modules=modules,
        persistent=len(kept),
        persistent_params=float(sum(kept)),
        fetched_params=float(sum(fetched)),
        fetch_calls=_prefetch_calls(fetched),
    )


def _prefetch_calls(sizes: list[int]) -> int:
    """Coalesced all-gathers of parameters fetched in this order: each call takes the next parameters
    while they fit ``DEEPSPEED_PREFETCH_BUCKET_ELEMENTS`` (a larger one goes alone)."""
    calls, room = 0, 0
    for n in sizes:
        if n > room:
            calls, room = calls + 1, DEEPSPEED_PREFETCH_BUCKET_ELEMENTS
        room -= n
    return calls


def megatron_bucket_elements(plan: ParallelPlan) -> int:
    """Megatron's default gradient bucket for the plan's DP x CP group (``MEGATRON_BUCKET_ELEMENTS``)."""
    return max(MEGATRON_BUCKET_ELEMENTS, MEGATRON_BUCKET_ELEMENTS_PER_RANK * plan.dp * plan.cp)


def collective_calls(model: ModelSpec, plan: ParallelPlan, params: float, blocks: int) -> tuple[int, int]:
    """(parameter all-gathers, gradient reductions) one pass of the DP group issues over a rank's ``params``
    held in ``blocks`` transformer blocks; each pays the ring latency (``comm.allgather_s`` ``calls``).

    - FSDP2 (``fully_shard`` per block and per end, as torchtitan and the trials wrap:
      ``trials.parallelize.end_units``): one of each per block, plus the embeddings' and the head's (one
      unit when they are tied; a pipeline stage holds at most one end); ``replicate`` per block and the
      root.
    - Megatron: gradient buckets of ``megatron_bucket_elements`` (its DDP ``bucket_size``), the distributed
      optimizer's parameter gather over the same buckets.
    - DeepSpeed ZeRO-0/1/2: ``reduce_bucket_size`` / ``allreduce_bucket_size`` buckets (5e8 elements), and
      ZeRO-1/2's ``allgather_bucket_size`` (5e8) for the updated parameters.
      ZeRO-3: an all-gather per persistent parameter and the coalesced fetches of the others
      (``zero3_gathers``: what one micro-batch's step issues); its gradients in ``reduce_bucket_size``
      buckets.
    """
    if plan.framework is Framework.FSDP:
        ends = 2 if plan.pp == 1 and plan.sharding is not Sharding.NONE and not model.tie_embeddings else 1
        return blocks + ends, blocks + ends
    if plan.framework is Framework.MEGATRON:
        buckets = max(1, math.ceil(params / megatron_bucket_elements(plan)))
        return buckets, buckets
    buckets = max(1, math.ceil(params / DEEPSPEED_REDUCE_BUCKET_ELEMENTS))
    if plan.zero_stage < 3:
        return buckets, buckets
    gathers = zero3_gathers(model, plan.tp)
    return gathers.persistent + gathers.fetch_calls, buckets


def dp_comm_s(
    cluster: ClusterSpec, model: ModelSpec, plan: ParallelPlan, params: float, blocks: int
) -> DpComm:
    """DP/ZeRO/FSDP communication of one step (Rajbhandari et al. 2020 Sec. 7; Zhao et al. 2023, FSDP Sec. 3).
    The group is ``dp x cp`` ranks at stride ``tp`` (CP ranks hold the same weights).

    none: all-reduce grads once per step (FSDP2's ``replicate``: in every micro-batch's backward).
    zero1: reduce-scatter grads + all-gather 16-bit params once per step (Megatron distributed optimizer;
    DeepSpeed all-reduces the gradient buckets instead, ``DEEPSPEED_BUCKET_ALLREDUCE``). zero2: DeepSpeed
    reduces gradients in every micro-batch's backward, gathers params once. DeepSpeed ZeRO-0 and ZeRO-1
    reduce after the last backward and ZeRO-1/2 gather the updated parameters after the optimizer step, with
    no compute left to hide behind (``DEEPSPEED_EXPOSED``). zero3 / fsdp-full / hsdp: every
    micro-batch all-gathers params for forward and again for backward and reduce-scatters grads; fsdp-grad-op
    keeps the forward gather for backward, and so does DeepSpeed ZeRO-3 under its reuse distance, which
    gathers its small parameters once per step after the optimizer instead (``zero3_gathers``). hsdp shards
    inside groups of ``hsdp_shard_size`` and all-reduces the shard across replicas once per step. FSDP2 under
    pipelining: ``_pipelined_fsdp_comm``.
    """
    n = plan.dp * plan.cp
    if n <= 1:
        return DpComm(0.0, 0.0, 0.0)
    shard = plan.shard_degree * plan.cp
    link = comm.group_link(cluster, shard, plan.tp)
    widen = cluster.gpu.half_bytes / 2  # 2 on the CPU trial device, which runs 16-bit plans in fp32
    per_grad = (
        megatron_grad_bytes(plan)
        if plan.framework is Framework.MEGATRON  # its main_grad dtype
        else GRAD_REDUCE_BYTES[plan.framework.value]
    )
    grad_per = per_grad * (widen if per_grad == 2 else 1)  # 16-bit gradients (fp32 ones stay)
    grad_bytes = params * grad_per
    param_bytes = params * PARAM_GATHER_BYTES * widen
    sharding = plan.sharding
    deepspeed = plan.framework is Framework.DEEPSPEED
    if sharding is Sharding.NONE:
        all_reduce_s = _allreduce_s(cluster, model, plan, params, blocks, grad_per)
        if defers_grad_reduce(plan) or (deepspeed and DEEPSPEED_EXPOSED):
            return DpComm(0.0, 0.0, all_reduce_s)
        if plan.framework is Framework.FSDP:  # replicate() reduces every backward (no no_sync in the loop)
            return DpComm(all_reduce_s, 0.0, 0.0)
        hidden, exposed = _megatron_overlap_split(plan, all_reduce_s, 0.0)
        return DpComm(0.0, hidden, exposed)
    if sharding in (Sharding.ZERO1, Sharding.ZERO2):
        if deepspeed and DEEPSPEED_BUCKET_ALLREDUCE:
            gathers, reduces = collective_calls(model, plan, params, blocks)
            grads_s = comm.allreduce_s(grad_bytes, n, link, reduces)
            params_s = comm.allgather_s(param_bytes, n, link, gathers)
        else:
            grads_s, params_s = _zero1_pair_s(cluster, model, plan, params, blocks, grad_per)
        if deepspeed and DEEPSPEED_EXPOSED:
            if sharding is Sharding.ZERO1:
                return DpComm(0.0, 0.0, grads_s + params_s)
            return DpComm(grads_s, 0.0, params_s)
        if sharding is Sharding.ZERO1:
            hidden, exposed = _megatron_overlap_split(plan, grads_s, params_s)
            return DpComm(0.0, hidden, exposed)
        return DpComm(grads_s, params_s, 0.0)
    gather_s = reduce_s = 0.0
    for i, (part, size, part_link) in enumerate(_parts(cluster, model, plan, params, blocks, shard, link)):
        # the dense units, then one more FSDP unit per MoE block: its experts (expert_dp_split)
        calls = collective_calls(model, plan, part, blocks) if i == 0 else (_moe_units(model, blocks),) * 2
        gather_s += comm.allgather_s(part * PARAM_GATHER_BYTES * widen, size, part_link, calls[0])
        reduce_s += comm.reduce_scatter_s(part * grad_per, size, part_link, calls[1])
    replica_s = _hsdp_replica_s(cluster, plan, grad_bytes / shard) if sharding is Sharding.HSDP else 0.0
    if defers_grad_reduce(plan):
        return _pipelined_fsdp_comm(plan, gather_s, reduce_s + replica_s)
    if deepspeed:
        return _zero3_comm(model, plan, shard, link, widen, reduce_s)
    return DpComm(gathers_per_microbatch(plan) * gather_s + reduce_s, replica_s, 0.0)


def expert_dp_split(model: ModelSpec, plan: ParallelPlan, params: float, blocks: int) -> tuple[float, float]:
    """(dense, routed-expert) parameters of a rank's ``params`` whose collectives run over different groups:
    the dense ones over DP x CP (FSDP: the shard group), the routed experts over the expert-data-parallel
    group (``_expert_group``). Megatron keeps expert parameters in their own DDP buffers, reduced over
    ``expt_dp_group`` (megatron/core/distributed/distributed_data_parallel.py), and the distributed optimizer
    shards them over it; torchtitan wraps each block's experts in their own ``fully_shard`` over the sparse
    mesh's ``efsdp`` dimension (torchtitan/distributed/parallel_dims.py: mesh ``pp, dp_replicate, efsdp, ep,
    etp``). DeepSpeed-MoE, dense models and EP 1: all dense."""
    fw = plan.framework
    if fw not in (Framework.MEGATRON, Framework.FSDP) or not model.is_moe or plan.ep * plan.etp == 1:
        return params, 0.0
    experts = moe.expert_params_per_gpu(model, plan, model.num_layers if plan.pp == 1 else blocks)
    experts = min(experts, params)
    return params - experts, experts


def _expert_group(cluster: ClusterSpec, plan: ParallelPlan) -> tuple[int, comm.GroupLink]:
    """Size and link of the routed experts' data-parallel group: ``ParallelPlan.expert_shard_degree`` ranks
    at stride ``ep x etp`` (Megatron's expert rank order is etp, ep, dp, pp:
    megatron/core/parallel_state.py ``expert_decoder_rank_generator``; torchtitan's mesh order above)."""
    size = plan.expert_shard_degree
    return size, comm.group_link(cluster, size, plan.ep * plan.etp)


def _parts(
    cluster: ClusterSpec,
    model: ModelSpec,
    plan: ParallelPlan,
    params: float,
    blocks: int,
    size: int,
    link: comm.GroupLink,
) -> list[tuple[float, int, comm.GroupLink]]:
    """``(parameters, group size, link)`` of each group a rank's parameters travel over: the dense ones over
    ``size`` ranks on ``link``, the routed experts (if any, ``expert_dp_split``) over ``_expert_group``."""
    dense, experts = expert_dp_split(model, plan, params, blocks)
    return [(dense, size, link)] + ([(experts, *_expert_group(cluster, plan))] if experts else [])


def _moe_units(model: ModelSpec, blocks: int) -> int:
    """The MoE blocks among a rank's ``blocks``: one expert FSDP unit each."""
    return max(1, math.ceil(blocks * len(model.moe_layers) / model.num_layers))


def _zero1_pair_s(
    cluster: ClusterSpec, model: ModelSpec, plan: ParallelPlan, params: float, blocks: int, grad_per: float
) -> tuple[float, float]:
    """(gradient reduce-scatter, parameter all-gather) seconds of a ZeRO-1/2 step over each group
    (``_parts``), each in the framework's buckets (``collective_calls``)."""
    n, widen = plan.dp * plan.cp, cluster.gpu.half_bytes / 2
    grads_s = params_s = 0.0
    for part, size, link in _parts(
        cluster, model, plan, params, blocks, n, comm.group_link(cluster, n, plan.tp)
    ):
        gathers, reduces = collective_calls(model, plan, part, blocks)
        grads_s += comm.reduce_scatter_s(part * grad_per, size, link, reduces)
        params_s += comm.allgather_s(part * PARAM_GATHER_BYTES * widen, size, link, gathers)
    return grads_s, params_s


def _allreduce_s(
    cluster: ClusterSpec, model: ModelSpec, plan: ParallelPlan, params: float, blocks: int, grad_per: float
) -> float:
    """Seconds to all-reduce a rank's gradients without sharding, over each group (``_parts``)."""
    n = plan.dp * plan.cp
    return sum(
        comm.allreduce_s(part * grad_per, size, link, collective_calls(model, plan, part, blocks)[1])
        for part, size, link in _parts(
            cluster, model, plan, params, blocks, n, comm.group_link(cluster, n, plan.tp)
        )
    )


def _megatron_overlap_split(plan: ParallelPlan, grads_s: float, params_s: float) -> tuple[float, float]:
    """(overlappable, exposed) seconds of the once-per-step gradient reduction and parameter gather. Megatron
    without ``--overlap-grad-reduce`` reduces the gradient buffers after the last backward
    (megatron/core/distributed/distributed_data_parallel.py ``finish_grad_sync`` from
    ``finalize_model_grads``); without ``--overlap-param-gather`` the distributed optimizer all-gathers the
    updated parameters inside ``step`` (megatron/core/optimizer/distrib_optimizer.py) instead of bucket by
    bucket under the next forward. Other frameworks: both overlappable."""
    if plan.framework is not Framework.MEGATRON:
        return grads_s + params_s, 0.0
    grads_hidden = plan.overlap_grad_reduce
    params_hidden = plan.overlap_param_gather
    return (
        (grads_s if grads_hidden else 0.0) + (params_s if params_hidden else 0.0),
        (0.0 if grads_hidden else grads_s) + (0.0 if params_hidden else params_s),
    )


def _zero3_comm(
    model: ModelSpec, plan: ParallelPlan, shard: int, link: comm.GroupLink, widen: float, reduce_s: float
) -> DpComm:
    """DeepSpeed ZeRO-3 (``zero3_gathers``): every micro-batch fetches the large parameters in coalesced
    all-gathers (again in backward beyond ``DEEPSPEED_MAX_REUSE_ELEMENTS``) and reduce-scatters the gradients;
    after the optimizer step each persistent parameter is all-gathered on its own, exposed."""
    g = zero3_gathers(model, plan.tp)
    passes = 1 if g.fetched_params <= DEEPSPEED_MAX_REUSE_ELEMENTS else 2
    fetch_s = comm.allgather_s(g.fetched_params * PARAM_GATHER_BYTES * widen, shard, link, g.fetch_calls)
    kept_s = comm.allgather_s(g.persistent_params * PARAM_GATHER_BYTES * widen, shard, link, g.persistent)
    return DpComm(passes * fetch_s + reduce_s, 0.0, kept_s)


def _hsdp_replica_s(cluster: ClusterSpec, plan: ParallelPlan, shard_grad_bytes: float) -> float:
    """HSDP's all-reduce of the reduce-scattered shard across the ``dp / hsdp_shard_size`` replicas."""
    shard = plan.shard_degree * plan.cp
    replicas = plan.dp * plan.cp // shard
    return comm.allreduce_s(shard_grad_bytes, replicas, comm.group_link(cluster, replicas, plan.tp * shard))


def _pipelined_fsdp_comm(plan: ParallelPlan, gather_s: float, reduce_s: float) -> DpComm:
    """FSDP2 stages of ``torch.distributed.pipelining`` (``states.defers_grad_reduce``; torch 2.13).

    Gradients: one reduce-scatter (and HSDP all-reduce) per step, in ``perform_reduce_grad`` after the last
    backward (stage.py); its ``_root_post_backward_final_callback`` runs ``finalize_backward``
    (fsdp/_fully_shard/_fsdp_param_group.py), which makes the compute stream wait on every reduction: exposed.
    Gathers: a unit gathered in backward stays gathered (``reshard_after_backward=False``), so the next
    forward's ``unshard`` is a no-op (``if self.is_unsharded: return``) and a backward right after a backward
    gathers nothing. A stage's ``m`` forwards and ``m`` backwards, starting with a forward and ending with a
    backward, thus gather ``m + 1`` times in every schedule (GPipe: ``m`` forwards + the first backward;
    1F1B: the warm-up forwards + each backward that follows a forward); fsdp-grad-op
    (``reshard_after_forward=False``) gathers once, in the first forward. Interleaved (schedules.py
    ``_add_unshard_reshard``) gathers each chunk when it becomes active, in place of its first forward's
    gather; with more than ``max_active_stages=3`` chunks per rank, evicted chunks re-gather (not counted)."""
    if plan.sharding is Sharding.FSDP_GRAD_OP:
        return DpComm(0.0, gather_s, reduce_s)
    m = plan.num_microbatches
    return DpComm((m + 1) / m * gather_s, 0.0, reduce_s)


def gathers_per_microbatch(plan: ParallelPlan) -> int:
    """Parameter all-gathers per micro-batch of ZeRO-3/FSDP: forward and backward, or one for fsdp-grad-op
    (``reshard_after_forward=False``)."""
    return 1 if plan.sharding is Sharding.FSDP_GRAD_OP else 2
