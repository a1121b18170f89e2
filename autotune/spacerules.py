"""The search space's knobs and the rules that prune their combinations, asked of ``autotune.legality``.

The enumerator (``autotune.enumeration``) and the Optuna path (``space.plan_from_params``) check a
combination before any ``ParallelPlan`` exists: the layout first, then the other knobs, then each
micro-batch. Every rule is a predicate of ``autotune.legality`` (the one ``ParallelPlan`` and
``check_plan`` use); this module only orders them and names each broken rule in a short reason, the key
the tally counts by.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from autotune.legalrules import (
    a2a_heads_bad,
    a2a_unavailable,
    capacity_broken,
    cp_seq_bad,
    deepspeed_broken,
    ep_overlap_broken,
    expert_fold_broken,
    expert_model_broken,
    fp8_recipe_missing,
    hsdp_group_bad,
    interleave_bad,
    megatron_fsdp_bad,
    megatron_optimizer_broken,
    megatron_runs_stores,
    microbatch_broken,
    mxfp8_gpu_bad,
    nothing_to_shard,
    offload_unsharded,
    seq_split_bad,
    shard_ranks,
    store_dtype_broken,
    tp_split_broken,
    zero_bubble_broken,
)
from autotune.planenums import (
    FRAMEWORK_SHARDING,
    MOE_DISPATCHERS,
    CpComm,
    Fp8Recipe,
    Framework,
    MoeDispatcher,
    Precision,
    Recompute,
    Schedule,
    Sharding,
    plain,
)
from autotune.stagesplit import split_error

if TYPE_CHECKING:
    from autotune.space import PlanContext

__all__ = [
    "HEAD_FIELDS",
    "KNOBS",
    "BATCH_RULE",
    "ARITHMETIC_RULES",
    "telling_reasons",
    "Variant",
    "collapse",
    "head_rule",
    "rest_rule",
    "SPEED_KNOBS",
    "COLLAPSED_KNOBS",
    "layout_rule",
    "variant_rule",
    "offers",
    "SHARDING_RULE",
    "pipeline_rule",
    "plain",
]

SPEED_KNOBS = (
    "fp8_recipe",
    "compile",
    "async_tp",
    "tp_comm_overlap",
    "cp_comm",
    "moe_dispatcher",
    "moe_a2a_overlap",
)
"""The speed knobs (``collapse`` sets each to its default where it does not apply)."""
COLLAPSED_KNOBS = (*SPEED_KNOBS, "offload_modules")
"""Every knob ``collapse`` defaults where it does not apply: the speed knobs, Megatron's expert offload."""

KNOBS = (
    "tp",
    "pp",
    "cp",
    "micro_batch",
    "framework",
    "sharding",
    "hsdp_shard_size",
    "offload",
    "schedule",
    "virtual_stages",
    "recompute",
    "sequence_parallel",
    "precision",
    "ep",
    "etp",
    *COLLAPSED_KNOBS,
)

BATCH_RULE = "global batch is not divisible by DP x micro-batch"


class Variant(NamedTuple):
    """Everything but the layout and the micro-batch."""

    framework: Framework
    sharding: Sharding
    hsdp_shard_size: int | None
    offload: bool
    schedule: Schedule
    virtual_stages: int
    recompute: Recompute
    sequence_parallel: bool
    precision: Precision
    ep: int = 1
    etp: int = 1
    fp8_recipe: Fp8Recipe = Fp8Recipe.TENSORWISE
    compile: bool = False
    async_tp: bool = False
    tp_comm_overlap: bool = False
    cp_comm: CpComm = CpComm.P2P
    moe_dispatcher: MoeDispatcher = MoeDispatcher.ALLTOALL
    moe_a2a_overlap: bool = False
    offload_modules: tuple[str, ...] = ()


def collapse(v: Variant, tp: int, cp: int) -> Variant:
    """Knobs that do not matter in this combination, at their defaults (as SP is without TP): the fp8
    recipe without fp8, compile and async TP outside the torch framework (async TP also without TP or
    compile), TP-comm overlap outside Megatron or without SP, the CP exchange without CP, the experts'
    activation offload outside Megatron."""
    torch_fw, fp8 = v.framework is Framework.FSDP, v.precision is Precision.FP8
    return v._replace(
        fp8_recipe=v.fp8_recipe if fp8 else Fp8Recipe.TENSORWISE,
        compile=v.compile and torch_fw,
        async_tp=v.async_tp and torch_fw and v.compile and tp > 1,
        tp_comm_overlap=(
            v.tp_comm_overlap and v.framework is Framework.MEGATRON and v.sequence_parallel and tp > 1
        ),
        cp_comm=v.cp_comm if cp > 1 else CpComm.P2P,
        moe_dispatcher=(
            v.moe_dispatcher
            if v.ep > 1 and v.moe_dispatcher in MOE_DISPATCHERS[v.framework]
            else MoeDispatcher.ALLTOALL
        ),
        moe_a2a_overlap=v.moe_a2a_overlap and v.ep > 1 and v.framework is Framework.MEGATRON,
        offload_modules=v.offload_modules if v.framework is Framework.MEGATRON else (),
    )


def layout_rule(ctx: PlanContext, tp: int, pp: int, cp: int) -> str | None:
    model = ctx.model
    split = tp_split_broken(model, tp, kv_replicas=True)  # Megatron's K/V replicas: variant_rule
    if split:
        return _TP_SPLIT[split[0]]
    if pp > model.num_layers:
        return "PP exceeds the layers"
    if ctx.cluster.num_gpus % (tp * pp * cp):
        return "TP x PP x CP does not divide the GPU count"
    if cp_seq_bad(ctx.seq_len, cp):
        return "seq-len is not divisible by 2 x CP"
    return None


_TP_SPLIT = {
    "heads": "TP does not divide the attention heads",
    "kv-heads": "TP does not divide the KV heads",
    "mlp": "TP does not divide the MLP width",
}


SEQ_SPLIT_RULE = "seq-len is not divisible by TP x CP (x 2 in torchtitan): the sequence is split over TP too"
SHARDING_RULE = "the framework does not offer this sharding"
"""``variant_rule``'s first rule, which needs no layout (``enumeration`` counts it per layout at once)."""
HEAD_FIELDS = 4  # what ``head_rule`` reads of a variant: framework, sharding, HSDP group, offload
assert Variant._fields[:HEAD_FIELDS] == ("framework", "sharding", "hsdp_shard_size", "offload")


def offers(framework: Framework, sharding: Sharding) -> bool:
    """Whether ``framework`` offers ``sharding`` (``FRAMEWORK_SHARDING``; ``variant_rule``'s first rule)."""
    return sharding in FRAMEWORK_SHARDING[framework]


def variant_rule(ctx: PlanContext, v: Variant, tp: int, pp: int, cp: int, dp: int) -> str | None:
    """The first rule a variant breaks on this layout: ``head_rule``'s, then the others'."""
    return head_rule(ctx, v[:HEAD_FIELDS], tp, pp, cp, dp) or rest_rule(ctx, v, tp, pp, cp, dp)


def head_rule(ctx: PlanContext, head: tuple[Any, ...], tp: int, pp: int, cp: int, dp: int) -> str | None:
    """``variant_rule``'s first rules, which read the layout and ``head`` (a variant's first
    ``HEAD_FIELDS``) only: every variant of a head breaks the same one first (``enumeration`` asks once)."""
    fw, sharding, hsdp_shard_size, offload = head
    if ctx.model.num_kv_heads % tp and fw is not Framework.MEGATRON:  # only Megatron replicates K/V heads
        return _TP_SPLIT["kv-heads"]
    if not offers(fw, sharding):
        return SHARDING_RULE
    if nothing_to_shard(sharding, shard_ranks(dp, cp)):
        return "sharding needs DP > 1"
    if sharding is Sharding.HSDP and hsdp_group_bad(hsdp_shard_size, dp):
        return "the HSDP shard group must divide DP (1 < size < DP)"
    if offload_unsharded(offload, sharding):
        return "offload needs a sharded optimizer"
    if megatron_fsdp_bad(fw, sharding, pp, offload):
        return "Megatron-FSDP is priced without pipelining or offload"
    return None


def rest_rule(ctx: PlanContext, v: Variant, tp: int, pp: int, cp: int, dp: int) -> str | None:
    """``variant_rule``'s rules after ``head_rule``'s, for a variant whose head broke none."""
    sharding, fw = v.sharding, v.framework
    if fw is Framework.DEEPSPEED and (
        broken := deepspeed_broken(
            tp=tp,
            pp=pp,
            cp=cp,
            sharding=sharding,
            schedule=v.schedule,
            precision=v.precision,
            sequence_parallel=v.sequence_parallel,
            cp_comm=v.cp_comm,
        )
    ):
        return _DEEPSPEED[broken[0]]
    if interleave_bad(v.schedule, pp, v.virtual_stages):
        if v.schedule.v_shape:
            return "zbv needs exactly 2 virtual stages"
        return "the interleaved schedule needs virtual stages >= 2"
    if zero_bubble := zero_bubble_broken(fw, v.schedule, v.compile):
        return _ZERO_BUBBLE[zero_bubble]
    if pp > 1 and split_error(ctx.model.num_layers, pp, v.virtual_stages, str(fw), ctx.model.mtp_layers):
        return "the framework cannot split the layers into PP x virtual stages"
    if not ctx.cluster.gpu.supports(str(v.precision)):
        return "the GPU lacks this precision"
    if mxfp8_gpu_bad(v.precision, v.fp8_recipe, ctx.cluster.gpu.compute_capability):
        return "MXFP8 needs Blackwell (compute capability 10.0+)"
    if seq_split_bad(fw, ctx.seq_len, tp, cp, v.sequence_parallel):
        return SEQ_SPLIT_RULE
    if ctx.model.mtp_layers and fw is not Framework.MEGATRON:
        return "multi-token prediction is priced for Megatron only"
    if capacity_broken(fw, ctx.moe_capacity_factor, MoeDispatcher.ALLTOALL) == "torchtitan":
        return "torchtitan's MoE has no capacity factor (dropless)"
    if broken_store := store_dtype_broken(
        fw,
        v.precision,
        ctx.custom_numerics,
        megatron_ok=megatron_runs_stores(
            ctx.weight_dtype, ctx.adam_dtype, ctx.loss_kernel, precision_aware=ctx.precision_aware_optimizer
        ),
    ):
        return _STORE_DTYPE[broken_store]
    if broken_optimizer := megatron_optimizer_broken(
        fw,
        v.sharding,
        dp,
        cp,
        precision_aware=ctx.precision_aware_optimizer,
        grad_reduce=ctx.grad_reduce_dtype is not None,
    ):
        return _MEGATRON_OPTIMIZER[broken_optimizer]
    return _expert_rule(ctx, v, tp, cp, dp) or _knob_rule(ctx, v, tp, pp, cp)


_MEGATRON_OPTIMIZER = {
    "framework": "the precision-aware optimizer and the gradient-reduce dtype are Megatron's",
    "distributed": "the precision-aware optimizer needs Megatron's distributed optimizer",
}
_ZERO_BUBBLE = {
    "framework": "the zero-bubble schedule is torch.distributed.pipelining's (framework fsdp)",
    "compile": "torch's zero-bubble schedule refuses compiled stage modules",
}
_STORE_DTYPE = {
    "framework": "bf16 weights or moments, or a loss kernel, are framework fsdp's (Megatron: a fused loss, "
    "bf16 moments under the precision-aware optimizer)",
    "fp16": "bf16 weights, moments or loss kernel do not go with fp16 compute",
}
_DEEPSPEED = {
    "pipeline-zero": "DeepSpeed's pipeline engine rejects ZeRO-2/3",
    "pipeline-tp": "DeepSpeed's pipeline engine fails with TP",
    "pipeline-schedule": "DeepSpeed's pipeline engine runs 1F1B only",
    "cp": "DeepSpeed's context parallelism is Ulysses (a2a)",
    "cp-pipeline": "DeepSpeed-Ulysses does not run in the pipeline engine",
    "cp-tp": "DeepSpeed-Ulysses is priced with TP = 1",
    "fp8": "DeepSpeed has no fp8 training path",
    "sp": "DeepSpeed AutoTP has no sequence parallelism",
}


def _expert_rule(ctx: PlanContext, v: Variant, tp: int, cp: int, dp: int) -> str | None:
    broken = expert_model_broken(
        ctx.model, v.framework, ep=v.ep, etp=v.etp, tp=tp, sequence_parallel=v.sequence_parallel
    )
    if broken:
        return _EXPERT[broken[0]]
    shard = 1 if v.sharding is Sharding.NONE else (v.hsdp_shard_size or dp)
    fold = expert_fold_broken(
        v.framework, ep=v.ep, etp=v.etp, tp=tp, dp=dp, cp=cp, shard=shard, sharding=v.sharding
    )
    return _EXPERT[fold] if fold else None


_TORCHTITAN_EP = "torchtitan: EP must divide dp_shard x CP (x TP with ETP 1), ETP in {1, TP}"
_EXPERT = {
    "dense": "EP/ETP > 1 on a dense model",
    "experts": "EP does not divide the routed experts",
    "width": "ETP does not divide the expert width",
    "megatron-sp": "Megatron MoE with TP > 1 needs sequence parallelism",
    "megatron": "Megatron: EP x ETP does not divide TP x DP x CP",
    "torchtitan-etp": _TORCHTITAN_EP,
    "torchtitan-borrow": _TORCHTITAN_EP,
    "deepspeed-tp": "DeepSpeed-MoE is priced with TP = ETP = 1",
    "deepspeed-dp": "DeepSpeed-MoE: EP does not divide DP",
    "deepspeed-zero3": "DeepSpeed-MoE does not run with ZeRO-3",
}


def _knob_rule(ctx: PlanContext, v: Variant, tp: int, pp: int, cp: int) -> str | None:
    if fp8_recipe_missing(v.framework, v.precision, v.fp8_recipe):
        return "the framework has no such fp8 recipe"
    if a2a_unavailable(v.framework, cp, v.cp_comm):
        return "cp-comm a2a runs in Megatron and DeepSpeed only"
    if a2a_heads_bad(ctx.model, tp, cp, v.cp_comm, v.framework):
        return "cp-comm a2a needs TP x CP to divide the heads (and CP to match a rank's KV heads)"
    if capacity_broken(v.framework, ctx.moe_capacity_factor, v.moe_dispatcher) == "dispatcher":
        return "Megatron's capacity factor needs the alltoall dispatcher"
    if v.moe_a2a_overlap and (
        broken := ep_overlap_broken(
            v.framework,
            ep=v.ep,
            pp=pp,
            schedule=v.schedule,
            dispatcher=v.moe_dispatcher,
            recompute=v.recompute,
            moe_recomputed=False,
        )
    ):
        return _EP_OVERLAP[broken]
    if v.moe_a2a_overlap and ctx.model.mtp_layers > 1:
        return "Megatron's EP overlap runs with at most one MTP module"
    if v.offload_modules and v.recompute is Recompute.FULL:
        return "the experts' activation offload has nothing to move under full recompute"
    return None


_EP_OVERLAP = {
    "framework": "Megatron's EP overlap runs in Megatron only",
    "ep": "Megatron's EP overlap needs EP > 1",
    "moe-recompute": "Megatron's EP overlap does not run with the MoE layer recomputed",
    "pipeline": "Megatron's EP overlap needs the interleaved schedule with PP > 1",
    "recompute": "Megatron's EP overlap does not run with full recompute",
    "dispatcher": "Megatron's EP overlap needs the alltoall or flex dispatcher",
}


def pipeline_rule(schedule: Schedule, pp: int, num_microbatches: int) -> str | None:
    broken = microbatch_broken(schedule, pp, num_microbatches)
    return _PIPELINE[broken[0]] if broken else None


_PIPELINE = {
    "too-few": "1F1B needs micro-batches per step >= PP",
    "not-divisible": "interleaved needs micro-batches per step divisible by PP",
    "rounds": "interleaved-zb needs micro-batches per step divisible by m // PP",
    "fill": "zbv needs micro-batches per step >= 2 PP - 1",
}


ARITHMETIC_RULES = frozenset(
    {
        BATCH_RULE,
        SHARDING_RULE,
        "PP exceeds the layers",
        "TP x PP x CP does not divide the GPU count",
        "seq-len is not divisible by 2 x CP",
        SEQ_SPLIT_RULE,
        "sharding needs DP > 1",
        "the HSDP shard group must divide DP (1 < size < DP)",
        "offload needs a sharded optimizer",
        "zbv needs exactly 2 virtual stages",
        "the interleaved schedule needs virtual stages >= 2",
    }
)
"""Rules that prune combinations of a wide space by their arithmetic, whatever the model and numerics: when
no plan is legal, the other reasons say why (``telling_reasons``)."""


def telling_reasons(pruned: dict[str, int]) -> list[tuple[str, int]]:
    """``pruned`` (reason -> combinations, most first) with the reasons that depend on the model, framework
    or numerics ahead of ``ARITHMETIC_RULES``."""
    items = list(pruned.items())
    return [i for i in items if i[0] not in ARITHMETIC_RULES] + [i for i in items if i[0] in ARITHMETIC_RULES]
