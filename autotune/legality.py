"""Which plans are legal, stated once: ``plan_errors`` (the plan alone), ``check_plan`` (with the model and
cluster), ``expert_errors`` (where EP/ETP fold into a stage's ranks).

Each rule that the search space also prunes by is a predicate in ``autotune.legalrules``, asked here and by
``autotune.spacerules``, which words the reason its own way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.legalmemory import memory_option_errors, recompute_modules_model_errors
from autotune.legalmixers import mixer_errors
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
    latent_moe_broken,
    megatron_fsdp_bad,
    microbatch_broken,
    mxfp8_gpu_bad,
    nothing_to_shard,
    offload_unsharded,
    seq_split_bad,
    shard_ranks,
    tp_split_broken,
    zero_bubble_broken,
)
from autotune.planenums import FP8_RECIPES, FRAMEWORK_SHARDING, MOE_DISPATCHERS, Framework, Sharding
from autotune.specs import ClusterSpec, ModelSpec
from autotune.stagesplit import split_error

if TYPE_CHECKING:
    from autotune.plan import ParallelPlan

__all__ = ["plan_errors", "check_plan", "expert_errors"]


def plan_errors(plan: ParallelPlan) -> list[str]:
    """Rules that need only the plan. Each message names the flag and what would satisfy it."""
    for name in (
        "tp",
        "pp",
        "dp",
        "cp",
        "micro_batch",
        "global_batch",
        "seq_len",
        "virtual_stages",
        "ep",
        "etp",
    ):
        value = getattr(plan, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return [f"{name.replace('_', '-')} must be a positive integer, got {value!r}"]
    errors = memory_option_errors(plan) + _capacity_errors(plan)
    per_step = plan.dp * plan.micro_batch
    if plan.global_batch % per_step:
        errors.append(
            f"global batch {plan.global_batch} is not divisible by DP x micro-batch = "
            f"{plan.dp} x {plan.micro_batch} = {per_step}"
        )
    errors += _sharding_errors(plan) + _pipeline_errors(plan) + _framework_errors(plan) + expert_errors(plan)
    if plan.sequence_parallel and plan.tp == 1:
        errors.append("sequence parallel needs TP > 1 (it splits norms/dropout over the TP group)")
    if cp_seq_bad(plan.seq_len, plan.cp):  # load-balanced ring attention: 2 x CP chunks per sequence
        errors.append(f"seq-len {plan.seq_len} is not divisible by 2 x CP = {2 * plan.cp} (ring chunks)")
    elif seq_split_bad(plan.framework, plan.seq_len, plan.tp, plan.cp, plan.sequence_parallel):
        x2 = " x 2" if plan.framework is Framework.FSDP else ""
        n = plan.tp * plan.cp * (2 if x2 else 1)
        errors.append(f"seq-len {plan.seq_len} is not divisible by TP x CP{x2} = {n}: it is split over TP")
    return errors


def _capacity_errors(plan: ParallelPlan) -> list[str]:
    """The user's MoE routing: an imbalance of at least 1, a positive capacity factor where the framework
    offers token dropping (``legalrules.capacity_broken``)."""
    if not plan.moe_load_imbalance >= 1.0:
        return [
            f"moe-load-imbalance is the busiest EP rank's routed tokens over the mean, >= 1; got "
            f"{plan.moe_load_imbalance}"
        ]
    c = plan.moe_capacity_factor
    if c is None:
        return []
    if not c > 0:
        return [f"moe-capacity-factor must be > 0 (or unset for dropless routing), got {c}"]
    broken = capacity_broken(plan.framework, c, plan.moe_dispatcher)
    if broken == "torchtitan":
        return ["moe-capacity-factor: torchtitan routes dropless; use --framework megatron or deepspeed"]
    if broken == "dispatcher":
        return ["moe-capacity-factor needs Megatron's alltoall dispatcher; use --moe-dispatcher alltoall"]
    return []


def _sharding_errors(plan: ParallelPlan) -> list[str]:
    errors: list[str] = []
    if plan.sharding is Sharding.HSDP:
        s = plan.hsdp_shard_size
        if hsdp_group_bad(s, plan.dp):
            errors.append(
                f"hsdp needs a shard-group size that divides DP={plan.dp} strictly between 1 and DP, got {s}"
            )
    elif plan.hsdp_shard_size is not None:
        errors.append("hsdp-shard-size is only meaningful with --sharding hsdp")
    if nothing_to_shard(plan.sharding, shard_ranks(plan.dp, plan.cp)):
        errors.append(f"sharding {plan.sharding} needs DP > 1 (with DP=1 there is nothing to shard over)")
    if offload_unsharded(plan.offload, plan.sharding):
        errors.append("optimizer offload needs a sharded optimizer (zero1-3 or an FSDP mode)")
    return errors


def _pipeline_errors(plan: ParallelPlan) -> list[str]:
    errors: list[str] = []
    if plan.schedule.v_shape:
        if interleave_bad(plan.schedule, plan.pp, plan.virtual_stages):
            errors.append(
                f"the {plan.schedule} schedule needs PP > 1 and exactly 2 virtual stages (two chunks per "
                "rank in a V); use --virtual-stages 2"
            )
    elif plan.schedule.looped:
        if interleave_bad(plan.schedule, plan.pp, plan.virtual_stages):
            errors.append(f"the {plan.schedule} schedule needs PP > 1 and virtual stages >= 2")
    elif plan.virtual_stages != 1:
        errors.append(
            f"virtual stages {plan.virtual_stages} need --schedule interleaved, interleaved-zb or zbv"
        )
    zero_bubble = zero_bubble_broken(plan.framework, plan.schedule, plan.compile)
    if zero_bubble == "framework":
        errors.append(
            f"{plan.schedule} is torch.distributed.pipelining's {plan.schedule.torch_class}: "
            f"framework {plan.framework} runs its own schedules; use --framework fsdp or --schedule "
            + ("interleaved" if plan.framework is Framework.MEGATRON else "1f1b")
        )
    if zero_bubble == "compile":
        errors.append("torch's zero-bubble schedule refuses compiled stage modules; drop --compile")
    if plan.pp > 1 and plan.global_batch % (plan.dp * plan.micro_batch) == 0:
        m = plan.num_microbatches
        broken = microbatch_broken(plan.schedule, plan.pp, m)
        if "too-few" in broken:
            errors.append(
                f"{plan.schedule} needs micro-batches per step >= PP: {m} < {plan.pp} "
                "(raise the global batch or lower the micro-batch)"
            )
        if "not-divisible" in broken:
            errors.append(f"interleaved needs micro-batches per step ({m}) divisible by PP ({plan.pp})")
        if "fill" in broken:
            errors.append(
                f"zbv needs micro-batches per step >= 2 PP - 1 = {2 * plan.pp - 1} to fill its V: {m} "
                "(torch pads the rest with idle slots; raise the global batch or lower the micro-batch)"
            )
        if "rounds" in broken:
            errors.append(
                f"interleaved-zb runs {m // plan.pp} rounds of micro-batches (m // PP) and needs the "
                f"micro-batches per step ({m}) divisible by them; use a multiple of PP ({plan.pp})"
            )
    return errors


def _framework_errors(plan: ParallelPlan) -> list[str]:
    fw = plan.framework
    errors: list[str] = []
    if plan.sharding not in FRAMEWORK_SHARDING[fw]:
        allowed = ", ".join(sorted(s.value for s in FRAMEWORK_SHARDING[fw]))
        errors.append(f"framework {fw} does not offer sharding {plan.sharding} (it offers: {allowed})")
    errors += _knob_errors(plan)
    if megatron_fsdp_bad(fw, plan.sharding, plan.pp, plan.offload):
        errors.append(
            "Megatron-FSDP is priced without pipelining or optimizer offload (as Megatron-Bridge's "
            "recipes run it); use --pp 1 without --offload, or --sharding zero1"
        )
    if fw is Framework.DEEPSPEED:
        broken = deepspeed_broken(
            tp=plan.tp,
            pp=plan.pp,
            cp=plan.cp,
            sharding=plan.sharding,
            schedule=plan.schedule,
            precision=plan.precision,
            sequence_parallel=plan.sequence_parallel,
            cp_comm=plan.cp_comm,
        )
        if "pipeline-zero" in broken:
            errors.append("DeepSpeed's pipeline engine rejects ZeRO-2/3; use zero1 or none with PP > 1")
        if "pipeline-tp" in broken:
            errors.append("DeepSpeed pipeline + AutoTP fails in the pipeline engine; use TP=1 or PP=1")
        if "pipeline-schedule" in broken:
            errors.append("DeepSpeed's pipeline engine runs its own 1F1B schedule only")
        if "cp" in broken:
            errors.append("DeepSpeed's context parallelism is Ulysses (all-to-all); use --cp-comm a2a")
        if "cp-pipeline" in broken:
            errors.append("DeepSpeed-Ulysses does not run in the pipeline engine; use PP=1 with CP > 1")
        if "cp-tp" in broken:
            errors.append("DeepSpeed-Ulysses splits the heads over CP, AutoTP too: use TP=1 with CP > 1")
        if "fp8" in broken:
            errors.append("DeepSpeed's engine has no fp8 training path; use bf16/fp16")
        if "sp" in broken:
            errors.append(
                "DeepSpeed AutoTP has no Megatron-style sequence parallelism; drop --sequence-parallel"
            )
    return errors


def _knob_errors(plan: ParallelPlan) -> list[str]:
    """Speed knobs a framework does not have, or that need another setting."""
    fw, errors = plan.framework, []
    if fp8_recipe_missing(fw, plan.precision, plan.fp8_recipe):
        allowed = ", ".join(sorted(r.value for r in FP8_RECIPES[fw]))
        errors.append(f"framework {fw} has no fp8 recipe {plan.fp8_recipe} (it offers: {allowed})")
    if plan.compile and fw is not Framework.FSDP:
        errors.append(f"compile is a torch framework knob; framework {fw} does not torch.compile the model")
    if plan.async_tp and (fw is not Framework.FSDP or not plan.compile or plan.tp == 1):
        errors.append("async TP needs --framework fsdp (torchtitan), --compile and TP > 1")
    if plan.tp_comm_overlap and (fw is not Framework.MEGATRON or not plan.sequence_parallel):
        errors.append("tp-comm-overlap is Megatron/TE's and needs --sequence-parallel (TP > 1)")
    if a2a_unavailable(fw, plan.cp, plan.cp_comm):
        errors.append(
            "cp-comm a2a (Ulysses) needs --framework megatron or deepspeed; torchtitan rotates K/V by p2p "
            "or allgather"
        )
    if plan.moe_dispatcher not in MOE_DISPATCHERS[fw]:
        offered = ", ".join(sorted(d.value for d in MOE_DISPATCHERS[fw]))
        errors.append(
            f"framework {fw} has no moe-dispatcher {plan.moe_dispatcher} (it offers: {offered}); use "
            "--framework megatron for Megatron's others"
        )
    if plan.moe_a2a_overlap:
        errors += _ep_overlap_errors(plan)
    # torchtitan and DeepSpeed always overlap; so does Megatron-FSDP (``MegatronFSDP.__init__`` turns both on
    # under optim_grads_params: megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py, 0.16.1)
    megatron_fsdp = fw is Framework.MEGATRON and plan.sharding is Sharding.FSDP_FULL
    both = plan.overlap_grad_reduce and plan.overlap_param_gather
    if not both and (fw is not Framework.MEGATRON or megatron_fsdp):
        who = "Megatron-FSDP" if megatron_fsdp else f"framework {fw}"
        off = "only megatron with --sharding zero1 or none turns overlap-grad-reduce / -param-gather off"
        errors.append(f"{who} always overlaps its DP collectives; {off}")
    return errors


_EP_OVERLAP = {
    "framework": "is Megatron's; use --framework megatron",
    "ep": "overlaps the expert-parallel all-to-all; it needs --ep > 1",
    "dispatcher": "runs with the alltoall or flex dispatchers; use --moe-dispatcher alltoall or deepep",
    "pipeline": "with PP > 1 needs --schedule interleaved (--virtual-stages >= 2)",
    "recompute": "does not run with full recompute; use --recompute selective or none",
    "moe-recompute": "does not run with moe in --recompute-modules; drop it",
}


def _ep_overlap_errors(plan: ParallelPlan) -> list[str]:
    broken = ep_overlap_broken(
        plan.framework,
        ep=plan.ep,
        pp=plan.pp,
        schedule=plan.schedule,
        dispatcher=plan.moe_dispatcher,
        recompute=plan.recompute,
        moe_recomputed="moe" in plan.recompute_modules,
    )
    return [f"moe-a2a-overlap {_EP_OVERLAP[broken]}"] if broken else []


def expert_errors(plan: ParallelPlan, framework: Framework | None = None) -> list[str]:
    """Where each framework (the plan's, or ``framework``: what an emitter targets) places EP and ETP inside
    a stage's ``tp x dp x cp`` ranks."""
    ep, etp, fw = plan.ep, plan.etp, framework or plan.framework
    shard = plan.shard_degree if plan.sharding is not Sharding.NONE else 1
    broken = expert_fold_broken(
        fw, ep=ep, etp=etp, tp=plan.tp, dp=plan.dp, cp=plan.cp, shard=shard, sharding=plan.sharding
    )
    if broken == "megatron":
        return [
            f"Megatron needs EP x ETP = {ep} x {etp} to divide TP x DP x CP = "
            f"{plan.tp * plan.dp * plan.cp} (expert parallelism folds into the dense ranks)"
        ]
    if broken == "torchtitan-etp":
        return [f"torchtitan supports ETP = 1 or ETP = TP ({plan.tp}), got {etp}"]
    if broken == "torchtitan-borrow":
        borrow = shard * plan.cp * (plan.tp // etp)
        unsharded = plan.sharding is Sharding.NONE and (plan.dp * plan.cp * (plan.tp // etp)) % ep == 0
        fix = " (sharding none leaves no dp_shard: shard DP with --sharding fsdp-full)" if unsharded else ""
        return [
            f"torchtitan borrows EP from dp_shard x CP{' x TP' if etp == 1 else ''} = {borrow}; "
            f"EP {ep} does not divide it{fix}"
        ]
    deepspeed = {
        "deepspeed-tp": "DeepSpeed-MoE is priced with TP = ETP = 1 here (its expert-slicing is not modelled)",
        "deepspeed-dp": f"DeepSpeed-MoE needs EP {ep} to divide DP {plan.dp}",
        "deepspeed-zero3": "DeepSpeed-MoE does not run with ZeRO-3; use zero1/zero2",
    }
    return [deepspeed[broken]] if broken in deepspeed else []


def _expert_model_errors(plan: ParallelPlan, model: ModelSpec) -> list[str]:
    broken = expert_model_broken(
        model, plan.framework, ep=plan.ep, etp=plan.etp, tp=plan.tp, sequence_parallel=plan.sequence_parallel
    )
    if "dense" in broken:
        return [
            f"EP {plan.ep} / ETP {plan.etp} on {model.name}, a dense model: expert parallelism needs "
            "routed experts; use --ep 1"
        ]
    errors = []
    if plan.moe_capacity_factor is not None and not model.is_moe:
        errors.append(f"moe-capacity-factor on {model.name}, a dense model: drop --moe-capacity-factor")
    if plan.moe_load_imbalance != 1.0 and not model.is_moe:
        errors.append(f"moe-load-imbalance on {model.name}, a dense model: drop --moe-load-imbalance")
    if "experts" in broken:
        errors.append(f"EP {plan.ep} does not divide the {model.num_experts} routed experts")
    if "width" in broken:
        errors.append(f"ETP {plan.etp} does not divide the expert width {model.expert_ffn_hidden_size}")
    if "megatron-sp" in broken:
        errors.append("Megatron MoE with TP > 1 needs --sequence-parallel")
    return errors


def check_plan(plan: ParallelPlan, model: ModelSpec, cluster: ClusterSpec) -> list[str]:
    """Rules that need the model and the cluster; [] when the plan is legal."""
    errors: list[str] = []
    if plan.world_size != cluster.num_gpus:
        errors.append(
            f"TP x PP x DP x CP = {plan.tp} x {plan.pp} x {plan.dp} x {plan.cp} = "
            f"{plan.world_size} does not equal the {cluster.num_gpus} GPUs"
        )
    megatron = plan.framework is Framework.MEGATRON
    split_by_tp = tp_split_broken(model, plan.tp, kv_replicas=megatron)
    if "heads" in split_by_tp:
        errors.append(f"TP {plan.tp} does not divide attention heads {model.num_heads}")
    if "kv-heads" in split_by_tp:
        verb = "neither divides nor is a multiple of" if megatron else "does not divide"
        hint = (
            " (Megatron replicates them over TP: --framework megatron)"
            if plan.tp % model.num_kv_heads == 0
            else ""
        )
        errors.append(f"TP {plan.tp} {verb} KV heads {model.num_kv_heads}" + ("" if megatron else hint))
    if a2a_heads_bad(model, plan.tp, plan.cp, plan.cp_comm):
        errors.append(
            f"cp-comm a2a splits heads over TP x CP = {plan.tp * plan.cp}, which does not divide "
            f"{model.num_heads} heads; use --cp-comm p2p"
        )
    elif a2a_heads_bad(model, plan.tp, plan.cp, plan.cp_comm, plan.framework):
        kv = max(model.num_kv_heads // plan.tp, 1)
        errors.append(
            f"DeepSpeed-Ulysses needs CP {plan.cp} <= KV heads {kv}; lower --cp"
            if plan.framework is Framework.DEEPSPEED
            else f"cp-comm a2a: CP {plan.cp} does not divide a rank's {kv} KV head(s) (TE); use p2p"
        )
    if "mlp" in split_by_tp:
        errors.append(f"TP {plan.tp} does not divide the MLP width {model.ffn_hidden_size}")
    split = split_error(model.num_layers, plan.pp, plan.virtual_stages, str(plan.framework), model.mtp_layers)
    if split:
        errors.append(split)
    if not cluster.gpu.supports(str(plan.precision)):
        errors.append(f"{cluster.gpu.key} has no {plan.precision} tensor cores")
    elif mxfp8_gpu_bad(plan.precision, plan.fp8_recipe, cc := cluster.gpu.compute_capability):
        errors.append(
            f"fp8-recipe mx (MXFP8) needs Blackwell, compute capability 10.0+; {cluster.gpu.key} is {cc}"
        )
    if plan.offload_modules and not model.is_moe:
        errors.append(
            f"offload-modules {' '.join(plan.offload_modules)} offloads routed-expert inputs; "
            f"{model.name} has no MoE layers"
        )
    errors += recompute_modules_model_errors(plan, model)
    errors += mixer_errors(plan, model)
    if latent := latent_moe_broken(model.moe_latent_size, plan.framework, plan.tp):
        errors.append(latent)
    return errors + _expert_model_errors(plan, model) + _mtp_errors(plan, model)


def _mtp_errors(plan: ParallelPlan, model: ModelSpec) -> list[str]:
    """Multi-token prediction is priced and emitted as Megatron runs it (``--mtp-num-layers``; torchtitan's
    DeepSeek-V3 MTP refuses PP and CP, DeepSpeed has no model code); the EP overlap takes one module
    (``TransformerConfig.__post_init__``)."""
    if not model.mtp_layers:
        return []
    if plan.framework is not Framework.MEGATRON:
        return [
            f"{model.name} has {model.mtp_layers} multi-token prediction module(s) "
            "(num_nextn_predict_layers / mtp_num_hidden_layers / num_mtp_modules), priced for Megatron "
            "(--mtp-num-layers): use --framework megatron, "
            "or set it to 0 to plan the main model"
        ]
    if model.mtp_layers > 1 and plan.moe_a2a_overlap:
        return ["moe-a2a-overlap runs with at most one multi-token prediction module (Megatron)"]
    return []
