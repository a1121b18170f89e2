"""The legality rules the search space prunes by, one predicate each over the few values the rule reads.

``autotune.legality`` words them as errors on a whole plan; ``autotune.spacerules`` asks them of partial
combinations before any ``ParallelPlan`` exists, so the enumerator, the Optuna path and ``ParallelPlan``
cannot drift apart.
"""

from __future__ import annotations

from autotune.planenums import (
    FP8_RECIPES,
    CpComm,
    Fp8Recipe,
    Framework,
    LossKernel,
    MoeDispatcher,
    Precision,
    Recompute,
    Schedule,
    Sharding,
    StoreDtype,
    zero_stage,
)
from autotune.specs import ModelSpec

__all__ = [
    "tp_split_broken",
    "cp_seq_bad",
    "seq_split_bad",
    "a2a_unavailable",
    "a2a_heads_bad",
    "fp8_recipe_missing",
    "mxfp8_gpu_bad",
    "hsdp_group_bad",
    "shard_ranks",
    "nothing_to_shard",
    "offload_unsharded",
    "megatron_fsdp_bad",
    "interleave_bad",
    "microbatch_broken",
    "zero_bubble_broken",
    "deepspeed_broken",
    "expert_model_broken",
    "expert_fold_broken",
    "latent_moe_broken",
    "capacity_broken",
    "store_dtype_broken",
    "megatron_runs_stores",
    "megatron_optimizer_broken",
    "ep_overlap_broken",
]


def tp_split_broken(model: ModelSpec, tp: int, *, kv_replicas: bool = False) -> list[str]:
    """What TP does not divide: attention ``heads``, ``kv-heads``, the ``mlp`` width. ``kv_replicas``: a TP
    that is a multiple of the KV heads is fine (Megatron-Core holds each K/V head on ``TP / KV heads`` ranks,
    ``modelshape.kv_replicas``); torchtitan and DeepSpeed AutoTP split the K/V heads and need TP to divide
    them."""
    sizes = {"heads": model.num_heads, "kv-heads": model.num_kv_heads, "mlp": model.ffn_hidden_size}
    broken = [name for name, n in sizes.items() if n % tp]
    if kv_replicas and "kv-heads" in broken and tp % model.num_kv_heads == 0:
        broken.remove("kv-heads")
    return broken


def cp_seq_bad(seq_len: int, cp: int) -> bool:
    """Load-balanced ring attention splits each sequence into 2 x CP chunks."""
    return cp > 1 and seq_len % (2 * cp) != 0


def seq_split_bad(fw: Framework, seq_len: int, tp: int, cp: int, sequence_parallel: bool) -> bool:
    """The sequence split over TP as well as CP: torchtitan asserts that TP x 2 CP divides it whenever TP > 1
    ("TP currently cannot handle uneven seq_len", ``ParallelDims.seq_len_divisor``, torchtitan 0.2.2);
    Megatron's sequence parallelism splits a CP rank's ``seq_len / cp`` tokens over TP and asserts it divides
    (megatron/core/tensor_parallel/mappings.py ``_split_along_first_dim``, core_v0.16.1)."""
    if tp <= 1:
        return False
    if fw is Framework.FSDP:
        return seq_len % (tp * 2 * cp) != 0
    return fw is Framework.MEGATRON and sequence_parallel and seq_len % (tp * cp) != 0


def a2a_unavailable(fw: Framework, cp: int, cp_comm: CpComm) -> bool:
    """Ulysses all-to-all runs in Megatron (TE ``a2a``) and DeepSpeed (``DistributedAttention``); torchtitan
    rotates K/V (p2p or all-gather)."""
    return cp > 1 and cp_comm is CpComm.A2A and fw is Framework.FSDP


def a2a_heads_bad(model: ModelSpec, tp: int, cp: int, cp_comm: CpComm, fw: Framework | None = None) -> bool:
    """Ulysses all-to-all splits the heads over TP x CP; under Megatron, Transformer Engine's also splits a
    rank's K/V heads over CP (``AttnFuncWithCPAndQKVOA2A``: "The number of attention heads needs to be
    divisible by CP size", q and k alike, transformer_engine/pytorch/attention/dot_product_attention/
    context_parallel.py at v2.5), one head per rank where TP exceeds the KV heads; DeepSpeed-Ulysses
    partitions by KV group and asserts at least one KV head per rank (deepspeed/sequence/layer.py
    ``_resolve_kv_heads``, 0.19.8: "Number of key-value heads ... must be at least the sequence parallel
    size")."""
    if cp <= 1 or cp_comm is not CpComm.A2A:
        return False
    kv_per_rank = max(model.num_kv_heads // tp, 1)
    te_kv = fw is Framework.MEGATRON and not model.uses_mla and kv_per_rank % cp != 0
    ds_kv = fw is Framework.DEEPSPEED and model.num_kv_heads < cp
    return model.num_heads % (tp * cp) != 0 or te_kv or ds_kv


def fp8_recipe_missing(fw: Framework, precision: Precision, recipe: Fp8Recipe) -> bool:
    return precision is Precision.FP8 and bool(FP8_RECIPES[fw]) and recipe not in FP8_RECIPES[fw]


def mxfp8_gpu_bad(precision: Precision, recipe: Fp8Recipe, compute_capability: float | None) -> bool:
    """MXFP8 needs Blackwell's block-scaled tensor cores (compute capability 10.0+): torchao's ``MXLinear``
    converter and Transformer Engine's ``MXFP8BlockScaling`` assert it (torchtitan
    components/quantization/mx.py: "MXFP8 is only supported on CUDA SM100 or later"). A GPU whose capability
    is not known is not judged."""
    mx = precision is Precision.FP8 and recipe is Fp8Recipe.MX
    return mx and compute_capability is not None and compute_capability < 10.0


def hsdp_group_bad(size: int | None, dp: int) -> bool:
    """HSDP needs a shard-group size strictly between 1 and DP that divides DP."""
    return size is None or not 1 < size < dp or dp % size != 0


def shard_ranks(dp: int, cp: int) -> int:
    """Ranks a sharded mode splits states over: DP x CP (CP ranks hold the same weights), so CP > 1 gives
    it ranks at DP = 1, as ``costmodel.states.state_shard_degree`` prices it. Megatron's distributed optimizer
    (megatron/core/optimizer/__init__.py: ``intra_dp_cp_group``); torchtitan's FSDP over the flattened
    ``dp_shard_cp`` mesh (torchtitan/models/llama3/parallelize_llama.py; its Dec 2024 benchmark runs "FSDP 1,
    CP 8"); DeepSpeed ZeRO over ``seq_data_parallel_group`` (deepspeed/runtime/engine.py
    ``_configure_zero_optimizer``: ``dp_process_group``), should its plans gain CP."""
    return dp * cp


def nothing_to_shard(sharding: Sharding, ranks: int) -> bool:
    """A sharded mode over a single rank shards nothing."""
    return sharding is not Sharding.NONE and ranks == 1


def offload_unsharded(offload: bool, sharding: Sharding) -> bool:
    return offload and sharding is Sharding.NONE


def megatron_fsdp_bad(fw: Framework, sharding: Sharding, pp: int, offload: bool) -> bool:
    """Megatron-FSDP is priced as Megatron-Bridge's recipes run it: no pipelining, no optimizer offload."""
    return fw is Framework.MEGATRON and sharding is Sharding.FSDP_FULL and (pp > 1 or offload)


def interleave_bad(schedule: Schedule, pp: int, virtual_stages: int) -> bool:
    """A looped schedule without PP or a second chunk; ZBV without exactly two chunks per rank (torch's
    ``ScheduleZBVZeroBubble.__init__`` raises on any other count)."""
    if schedule.v_shape:
        return pp == 1 or virtual_stages != 2
    return schedule.looped and (pp == 1 or virtual_stages < 2)


def microbatch_broken(schedule: Schedule, pp: int, num_microbatches: int) -> list[str]:
    """Pipeline schedules that need more micro-batches: ``too-few`` (< PP), ``not-divisible`` (by PP),
    ``rounds``: torch's ScheduleInterleavedZeroBubble runs ``m // pp`` rounds and needs ``m`` divisible by
    them (torch/distributed/pipelining/schedules.py, its ``__init__``); ``fill``: torch's ZBV plans
    ``max(2 pp - 1, m)`` micro-batches and leaves the padding slots idle (its
    ``_calculate_single_rank_operations``), a bubble the cost model's formula does not cover."""
    if pp == 1:
        return []
    m = num_microbatches
    if schedule.v_shape:
        return ["fill"] if m < 2 * pp - 1 else []
    broken = ["too-few"] if schedule is not Schedule.GPIPE and m < pp else []
    if schedule is Schedule.INTERLEAVED and m % pp:
        broken.append("not-divisible")
    if schedule is Schedule.INTERLEAVED_ZB and m % max(1, m // pp):
        broken.append("rounds")
    return broken


def zero_bubble_broken(fw: Framework, schedule: Schedule, compiled: bool) -> str | None:
    """Where the zero-bubble schedule cannot run: outside torch.distributed.pipelining ("framework": Megatron
    and DeepSpeed run their own schedules), or on compiled stage modules ("compile": torch's
    ``_check_torch_compile_compatibility`` refuses any ``OptimizedModule`` in a stage, and torchtitan compiles
    each block); None where it can."""
    if not schedule.zero_bubble:
        return None
    if fw is not Framework.FSDP:
        return "framework"
    return "compile" if compiled else None


def deepspeed_broken(
    *,
    tp: int,
    pp: int,
    cp: int,
    sharding: Sharding,
    schedule: Schedule,
    precision: Precision,
    sequence_parallel: bool,
    cp_comm: CpComm,
) -> list[str]:
    """What DeepSpeed's engine does not run, in the order the rules are reported. Its context parallelism is
    DeepSpeed-Ulysses (``deepspeed.sequence.layer.DistributedAttention``, Jacobs et al. 2023): all-to-all
    only, outside the pipeline engine, heads split over CP alone (not also by AutoTP)."""
    rules = {
        "pipeline-zero": pp > 1 and zero_stage(sharding) > 1,
        "pipeline-tp": pp > 1 and tp > 1,
        "pipeline-schedule": pp > 1 and schedule is not Schedule.ONE_F_ONE_B,
        "cp": cp > 1 and cp_comm is not CpComm.A2A,
        "cp-pipeline": cp > 1 and pp > 1,
        "cp-tp": cp > 1 and tp > 1,
        "fp8": precision is Precision.FP8,
        "sp": sequence_parallel,
    }
    return [name for name, broken in rules.items() if broken]


def expert_model_broken(
    model: ModelSpec, fw: Framework, *, ep: int, etp: int, tp: int, sequence_parallel: bool
) -> list[str]:
    """``dense`` (EP/ETP > 1 without routed experts), or what EP/ETP do not divide (``experts``,
    ``width``), and ``megatron-sp`` (megatron/training/arguments.py: MoE with TP needs sequence
    parallelism)."""
    if not model.is_moe:
        return ["dense"] if ep > 1 or etp > 1 else []
    rules = {
        "experts": model.num_experts % ep != 0,
        "width": model.expert_ffn_hidden_size % etp != 0,
        "megatron-sp": fw is Framework.MEGATRON and tp > 1 and not sequence_parallel,
    }
    return [name for name, broken in rules.items() if broken]


def latent_moe_broken(latent_size: int, fw: Framework, tp: int) -> str:
    """Who runs LatentMoE (routed experts behind ``fc1_latent_proj`` / ``fc2_latent_proj``): Megatron-Core
    (``moe_layer.py``) and NeMo AutoModel's FSDP2 + EP ``nemotron_v3`` model, whose MoE parallelizer asserts
    TP 1 (``components/moe/parallelizer.py``; its published Nemotron 3 Super run: 64 H100, EP 64, FSDP 64).
    DeepSpeed has no model code for it. Empty when the plan's framework runs it."""
    if not latent_size or fw is Framework.MEGATRON or (fw is Framework.FSDP and tp == 1):
        return ""
    if fw is Framework.FSDP:
        return f"LatentMoE with TP runs in Megatron-Core only: use --tp 1 or --framework megatron (TP {tp})"
    who = "Megatron-Core and FSDP2 (NeMo AutoModel)"
    return f"LatentMoE runs in {who}: use --framework megatron or fsdp, not {fw}"


def expert_fold_broken(
    fw: Framework, *, ep: int, etp: int, tp: int, dp: int, cp: int, shard: int, sharding: Sharding
) -> str | None:
    """The first way EP x ETP fails to fold into a stage's ``tp x dp x cp`` ranks (``shard``: the ranks
    the states are sharded over, 1 unsharded)."""
    if ep == 1 and etp == 1:
        return None
    if fw is Framework.MEGATRON and (tp * dp * cp) % (ep * etp):
        return "megatron"  # megatron/core/parallel_state.py: etp x ep x expert-dp tiles tp x cp x dp
    if fw is Framework.FSDP:
        if etp not in (1, tp):  # torchtitan/distributed/parallel_dims.py _validate
            return "torchtitan-etp"
        if (shard * cp * (tp // etp)) % ep:  # parallel_dims.py: efsdp = dp_shard x cp x tp / (etp x ep)
            return "torchtitan-borrow"
    if fw is Framework.DEEPSPEED:
        if etp > 1 or tp > 1:
            return "deepspeed-tp"
        if dp % ep:  # deepspeed/utils/groups.py _create_expert_and_data_parallel: EP divides DP
            return "deepspeed-dp"
        if zero_stage(sharding) == 3:  # deepspeed/runtime/engine.py: "MoE not supported with Stage 3"
            return "deepspeed-zero3"
    return None


def capacity_broken(fw: Framework, capacity: float | None, dispatcher: MoeDispatcher) -> str | None:
    """Where token dropping (a capacity factor) cannot run: torchtitan's MoE is dropless ("torchtitan");
    Megatron takes it only with its all-to-all dispatcher ("dispatcher": megatron/core/transformer/
    transformer_config.py, "moe_expert_capacity_factor only works with alltoall token dispatcher");
    DeepSpeed-MoE always."""
    if capacity is None:
        return None
    if fw is Framework.FSDP:
        return "torchtitan"
    if dispatcher is not MoeDispatcher.ALLTOALL:
        return "dispatcher"
    return None


def ep_overlap_broken(
    fw: Framework,
    *,
    ep: int,
    pp: int,
    schedule: Schedule,
    dispatcher: MoeDispatcher,
    recompute: Recompute,
    moe_recomputed: bool,
) -> str | None:
    """Where Megatron's EP all-to-all overlap (``--overlap-moe-expert-parallel-comm``) cannot run, as
    ``TransformerConfig.__post_init__`` asserts (megatron/core/transformer/transformer_config.py): only
    Megatron ("framework"), with EP > 1 ("ep"), the all-to-all or flex dispatcher ("dispatcher"), a virtual
    pipeline when PP > 1 ("pipeline"), no full recompute ("recompute") nor ``moe`` in
    ``--recompute-modules`` ("moe-recompute"). Its bf16/fp16 requirement holds for every plan precision (fp8
    runs on a bf16 model)."""
    if fw is not Framework.MEGATRON:
        return "framework"
    if ep <= 1:
        return "ep"
    if dispatcher is MoeDispatcher.ALLGATHER:
        return "dispatcher"
    if pp > 1 and schedule is not Schedule.INTERLEAVED:
        return "pipeline"
    if recompute is Recompute.FULL:
        return "recompute"
    if moe_recomputed:
        return "moe-recompute"
    return None


def store_dtype_broken(
    fw: Framework, precision: Precision, custom: bool, *, megatron_ok: bool = False
) -> str | None:
    """bf16 weights or moments, or a loss kernel other than eager fp32 (``ParallelPlan.numerics_flags``):
    "framework" unless fsdp (Megatron and DeepSpeed keep fp32 masters and run their own cross-entropy) or,
    ``megatron_ok``, every such choice is one Megatron runs (Transformer Engine's loss, ``LossKernel.FUSED``;
    bf16 Adam moments under its precision-aware optimizer); "fp16" beside fp16 compute; else None."""
    if not custom or (megatron_ok and fw is Framework.MEGATRON):
        return None
    if fw is not Framework.FSDP:
        return "framework"
    return "fp16" if precision is Precision.FP16 else None


def megatron_runs_stores(
    weight: StoreDtype, adam: StoreDtype | None, loss: LossKernel, *, precision_aware: bool
) -> bool:
    """Every stored dtype chosen is one Megatron runs (``store_dtype_broken``'s ``megatron_ok``): fp32
    weights, eager fp32 or Transformer Engine's fused loss, bf16 Adam moments only under the precision-aware
    optimizer (megatron-core 0.16.1 ``OptimizerConfig`` refuses them without it)."""
    moments_ok = adam is not StoreDtype.BF16 or precision_aware
    return weight is not StoreDtype.BF16 and loss in (LossKernel.FP32, LossKernel.FUSED) and moments_ok


def megatron_optimizer_broken(
    fw: Framework, sharding: Sharding, dp: int, cp: int, *, precision_aware: bool, grad_reduce: bool
) -> str | None:
    """Megatron's optimizer options: "framework" when the precision-aware optimizer or a gradient-reduce
    dtype is asked of another framework; "distributed" when the precision-aware optimizer has no
    distributed optimizer to ride on (Megatron's ``--use-precision-aware-optimizer`` needs
    ``--use-distributed-optimizer``: zero1 or Megatron-FSDP here, or nothing to shard at DP x CP = 1)."""
    if (precision_aware or grad_reduce) and fw is not Framework.MEGATRON:
        return "framework"
    distributed = sharding in (Sharding.ZERO1, Sharding.FSDP_FULL) or dp * cp == 1
    return "distributed" if precision_aware and not distributed else None
