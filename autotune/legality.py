"""Which plans are legal, stated once: ``plan_errors`` (the plan alone), ``check_plan`` (with the model and
cluster), ``expert_errors`` (where EP/ETP fold into a stage's ranks).

Each rule that the search space also prunes by is a predicate here (``hsdp_group_bad``, ``deepspeed_broken``,
``expert_fold_broken``, ...): ``autotune.spacerules`` asks these on its partial combinations and words the
reason its own way, so the enumerator, the Optuna path and ``ParallelPlan`` cannot drift apart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.planenums import (
    FP8_RECIPES,
    FRAMEWORK_SHARDING,
    RECOMPUTE_MODULES,
    CpComm,
    Fp8Recipe,
    Framework,
    MoeDispatcher,
    Precision,
    Recompute,
    Schedule,
    Sharding,
    zero_stage,
)
from autotune.specs import ClusterSpec, ModelSpec
from autotune.stagesplit import split_error

if TYPE_CHECKING:
    from autotune.plan import ParallelPlan

__all__ = [
    "plan_errors",
    "check_plan",
    "expert_errors",
    "tp_split_broken",
    "cp_seq_bad",
    "a2a_outside_megatron",
    "a2a_heads_bad",
    "fp8_recipe_missing",
    "hsdp_group_bad",
    "shard_ranks",
    "nothing_to_shard",
    "offload_unsharded",
    "megatron_fsdp_bad",
    "interleave_bad",
    "microbatch_broken",
    "deepspeed_broken",
    "expert_model_broken",
    "expert_fold_broken",
]


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
    errors: list[str] = []
    if plan.recompute_layers is not None:
        errors += _recompute_layers_errors(plan)
    if plan.recompute_modules:
        errors += _recompute_modules_errors(plan)
    errors += _megatron_memory_option_errors(plan)
    per_step = plan.dp * plan.micro_batch
    if plan.global_batch % per_step:
        errors.append(
            f"global batch {plan.global_batch} is not divisible by DP x micro-batch = "
            f"{plan.dp} x {plan.micro_batch} = {per_step}"
        )
    errors += _sharding_errors(plan) + _pipeline_errors(plan) + _framework_errors(plan) + expert_errors(plan)
    if plan.sequence_parallel and plan.tp == 1:
        errors.append("sequence parallel needs TP > 1 (it splits norms/dropout over the TP group)")
    if cp_seq_bad(plan.seq_len, plan.cp):
        errors.append(
            f"seq-len {plan.seq_len} is not divisible by 2 x CP = {2 * plan.cp} "
            "(load-balanced ring attention splits each sequence into 2*CP chunks)"
        )
    return errors


def _recompute_modules_errors(plan: ParallelPlan) -> list[str]:
    bad = [m for m in plan.recompute_modules if m not in RECOMPUTE_MODULES]
    if bad:
        return [f"recompute-modules: unknown module {bad[0]!r}; allowed: {', '.join(RECOMPUTE_MODULES)}"]
    if plan.recompute is not Recompute.SELECTIVE or plan.framework is not Framework.MEGATRON:
        return [
            "recompute-modules needs --recompute selective and --framework megatron "
            "(Megatron's --recompute-granularity selective --recompute-modules)"
        ]
    return []


def _megatron_memory_option_errors(plan: ParallelPlan) -> list[str]:
    """Activation offload and the precision-aware optimizer are Megatron options; Megatron's
    ``TransformerConfig.__post_init__`` rejects CPU offloading with pipeline parallelism."""
    n = plan.offload_activation_layers
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        return [f"offload-activation-layers must be a non-negative integer, got {n!r}"]
    errors = []
    if n and (plan.framework is not Framework.MEGATRON or plan.pp > 1):
        errors.append(
            "offload-activation-layers needs --framework megatron and --pp 1 (Megatron's "
            "--cpu-offloading-num-layers does not support pipeline parallelism)"
        )
    distributed = plan.sharding in (Sharding.ZERO1, Sharding.FSDP_FULL) or plan.dp * plan.cp == 1
    if plan.precision_aware_optimizer and (plan.framework is not Framework.MEGATRON or not distributed):
        errors.append(
            "precision-aware-optimizer needs --framework megatron and its distributed optimizer "
            "(--sharding zero1 or fsdp-full, or DP x CP = 1): Megatron's "
            "--use-precision-aware-optimizer"
        )
    if plan.grad_reduce_dtype is not None and plan.framework is not Framework.MEGATRON:
        errors.append(
            "grad-reduce-dtype needs --framework megatron (Megatron's --grad-reduce-in-bf16); "
            "FSDP2 reduces in fp32 and DeepSpeed in the 16-bit model dtype"
        )
    return errors


def _recompute_layers_errors(plan: ParallelPlan) -> list[str]:
    n = plan.recompute_layers
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        return [f"recompute-layers must be a positive integer, got {n!r}"]
    if plan.recompute is not Recompute.FULL or plan.framework is not Framework.MEGATRON:
        return [
            "recompute-layers needs --recompute full and --framework megatron "
            "(Megatron's --recompute-num-layers with --recompute-method block)"
        ]
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
    if nothing_to_shard(plan.sharding, shard_ranks(plan.framework, plan.dp, plan.cp)):
        errors.append(f"sharding {plan.sharding} needs DP > 1 (with DP=1 there is nothing to shard over)")
    if offload_unsharded(plan.offload, plan.sharding):
        errors.append("optimizer offload needs a sharded optimizer (zero1-3 or an FSDP mode)")
    return errors


def _pipeline_errors(plan: ParallelPlan) -> list[str]:
    errors: list[str] = []
    if plan.schedule is Schedule.INTERLEAVED:
        if interleave_bad(plan.schedule, plan.pp, plan.virtual_stages):
            errors.append("the interleaved schedule needs PP > 1 and virtual stages >= 2")
    elif plan.virtual_stages != 1:
        errors.append(f"virtual stages {plan.virtual_stages} need --schedule interleaved")
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
        )
        if "pipeline-zero" in broken:
            errors.append("DeepSpeed's pipeline engine rejects ZeRO-2/3; use zero1 or none with PP > 1")
        if "pipeline-tp" in broken:
            errors.append("DeepSpeed pipeline + AutoTP fails in the pipeline engine; use TP=1 or PP=1")
        if "pipeline-schedule" in broken:
            errors.append("DeepSpeed's pipeline engine runs its own 1F1B schedule only")
        if "cp" in broken:
            errors.append("DeepSpeed has no context parallelism here; use CP=1 or --framework fsdp/megatron")
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
    if a2a_outside_megatron(fw, plan.cp, plan.cp_comm):
        errors.append(
            "cp-comm a2a (Ulysses) needs --framework megatron; torchtitan rotates K/V by p2p or allgather"
        )
    if plan.moe_dispatcher is not MoeDispatcher.ALLTOALL and fw is not Framework.MEGATRON:
        errors.append(
            f"moe-dispatcher {plan.moe_dispatcher} is Megatron's flex dispatcher; use --framework "
            "megatron or moe-dispatcher alltoall"
        )
    if fw is not Framework.MEGATRON and not (plan.overlap_grad_reduce and plan.overlap_param_gather):
        errors.append(
            f"framework {fw} always overlaps its DP collectives; only megatron can turn "
            "overlap-grad-reduce / overlap-param-gather off"
        )
    return errors


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
        return [
            f"torchtitan borrows EP from dp_shard x CP{' x TP' if etp == 1 else ''} = {borrow}; "
            f"EP {ep} does not divide it"
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
    split_by_tp = tp_split_broken(model, plan.tp)
    if "heads" in split_by_tp:
        errors.append(f"TP {plan.tp} does not divide attention heads {model.num_heads}")
    if "kv-heads" in split_by_tp:
        errors.append(f"TP {plan.tp} does not divide KV heads {model.num_kv_heads}")
    if a2a_heads_bad(model, plan.tp, plan.cp, plan.cp_comm):
        errors.append(
            f"cp-comm a2a splits heads over TP x CP = {plan.tp * plan.cp}, which does not divide "
            f"{model.num_heads} heads; use --cp-comm p2p"
        )
    if "mlp" in split_by_tp:
        errors.append(f"TP {plan.tp} does not divide the MLP width {model.ffn_hidden_size}")
    split = split_error(model.num_layers, plan.pp, plan.virtual_stages, str(plan.framework))
    if split:
        errors.append(split)
    if not cluster.gpu.supports(str(plan.precision)):
        errors.append(f"{cluster.gpu.key} has no {plan.precision} tensor cores")
    if "mla_up_proj" in plan.recompute_modules and not model.uses_mla:
        errors.append(
            "recompute-modules mla_up_proj needs a model with multi-latent attention "
            "(Megatron's transformer_config.py refuses it otherwise)"
        )
    return errors + _expert_model_errors(plan, model)


# ---------------------------------------------------------------------------------------------- predicates
# One function per rule the search space also prunes by; each takes the few values the rule reads, so the
# space can ask it of a combination before any ParallelPlan exists.
def tp_split_broken(model: ModelSpec, tp: int) -> list[str]:
    """What TP does not divide: attention ``heads``, ``kv-heads``, the ``mlp`` width."""
    sizes = {"heads": model.num_heads, "kv-heads": model.num_kv_heads, "mlp": model.ffn_hidden_size}
    return [name for name, n in sizes.items() if n % tp]


def cp_seq_bad(seq_len: int, cp: int) -> bool:
    """Load-balanced ring attention splits each sequence into 2 x CP chunks."""
    return cp > 1 and seq_len % (2 * cp) != 0


def a2a_outside_megatron(fw: Framework, cp: int, cp_comm: CpComm) -> bool:
    return cp > 1 and cp_comm is CpComm.A2A and fw is not Framework.MEGATRON


def a2a_heads_bad(model: ModelSpec, tp: int, cp: int, cp_comm: CpComm) -> bool:
    """Ulysses all-to-all splits the heads over TP x CP."""
    return cp > 1 and cp_comm is CpComm.A2A and model.num_heads % (tp * cp) != 0


def fp8_recipe_missing(fw: Framework, precision: Precision, recipe: Fp8Recipe) -> bool:
    return precision is Precision.FP8 and bool(FP8_RECIPES[fw]) and recipe not in FP8_RECIPES[fw]


def hsdp_group_bad(size: int | None, dp: int) -> bool:
    """HSDP needs a shard-group size strictly between 1 and DP that divides DP."""
    return size is None or not 1 < size < dp or dp % size != 0


def shard_ranks(fw: Framework, dp: int, cp: int) -> int:
    """Ranks a sharded mode splits states over: DP, or DP x CP for Megatron's distributed optimizer
    (megatron/core/optimizer/__init__.py: ``intra_dp_cp_group``), so CP > 1 gives it ranks at DP = 1."""
    return dp * (cp if fw is Framework.MEGATRON else 1)


def nothing_to_shard(sharding: Sharding, ranks: int) -> bool:
    """A sharded mode over a single rank shards nothing."""
    return sharding is not Sharding.NONE and ranks == 1


def offload_unsharded(offload: bool, sharding: Sharding) -> bool:
    return offload and sharding is Sharding.NONE


def megatron_fsdp_bad(fw: Framework, sharding: Sharding, pp: int, offload: bool) -> bool:
    """Megatron-FSDP is priced as Megatron-Bridge's recipes run it: no pipelining, no optimizer offload."""
    return fw is Framework.MEGATRON and sharding is Sharding.FSDP_FULL and (pp > 1 or offload)


def interleave_bad(schedule: Schedule, pp: int, virtual_stages: int) -> bool:
    return schedule is Schedule.INTERLEAVED and (pp == 1 or virtual_stages < 2)


def microbatch_broken(schedule: Schedule, pp: int, num_microbatches: int) -> list[str]:
    """Pipeline schedules that need more micro-batches: ``too-few`` (< PP), ``not-divisible`` (by PP)."""
    if pp == 1:
        return []
    broken = ["too-few"] if schedule is not Schedule.GPIPE and num_microbatches < pp else []
    return broken + (["not-divisible"] if schedule is Schedule.INTERLEAVED and num_microbatches % pp else [])


def deepspeed_broken(
    *,
    tp: int,
    pp: int,
    cp: int,
    sharding: Sharding,
    schedule: Schedule,
    precision: Precision,
    sequence_parallel: bool,
) -> list[str]:
    """What DeepSpeed's engine does not run, in the order the rules are reported."""
    rules = {
        "pipeline-zero": pp > 1 and zero_stage(sharding) > 1,
        "pipeline-tp": pp > 1 and tp > 1,
        "pipeline-schedule": pp > 1 and schedule is not Schedule.ONE_F_ONE_B,
        "cp": cp > 1,
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
