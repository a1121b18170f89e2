"""ParallelPlan + ModelSpec -> Megatron-LM ``pretrain_gpt.py`` (hybrid models: ``pretrain_mamba.py``)
arguments (``megatron_args.txt``; pure).

Flag names are Megatron-LM's (``megatron/training/arguments.py`` and the ``TransformerConfig`` /
``ModelParallelConfig`` fields it turns into flags). The file holds one flag (with its value) per line and
nothing that needs quoting, so ``pretrain_gpt.py $(cat megatron_args.txt) <data/tokenizer flags>`` works.

Megatron's own rules, checked here before emitting: the layers split into PP x virtual stages (evenly, or
with the account-for-embedding/loss or first/last-stage flags of ``autotune/stagesplit.py``), global batch
divisible by micro-batch x DP (DP = world / (TP x PP x CP)), interleaving needs PP > 1.

The model's own flags (dense core, MoE, MLA, Gated DeltaNet, hybrid Mamba-2 for ``pretrain_mamba.py``) are
``emit.megatronmodel``'s (with what of a model Megatron-LM 0.16 cannot build); here the EP/ETP degrees and the
rest of the plan.
Beyond the layout, ``_overlap_args`` / ``priced_args`` / ``megatron_env`` emit what the cost model assumes and
Megatron does not do by default: the DP/TP overlaps of the plan, no dropout, and (TP or CP > 1)
``CUDA_DEVICE_MAX_CONNECTIONS=1``, which ``validate_args`` asserts before Blackwell.
"""

from __future__ import annotations

from autotune.emit.megatronmodel import megatron_entry, model_args
from autotune.errors import ConfigError
from autotune.plan import (
    FP8_RECIPES,
    Framework,
    GradDtype,
    LossKernel,
    ParallelPlan,
    Precision,
    Recompute,
    Schedule,
    Sharding,
    StoreDtype,
    expert_errors,
)
from autotune.specs import GPUSpec, ModelSpec
from autotune.stagesplit import (
    ACCOUNT_BOTH,
    ACCOUNT_LOSS,
    FIRST_LAST,
    LAYOUT,
    megatron_layout,
    split_error,
    split_layers,
)

__all__ = [
    "megatron_unsupported",
    "megatron_args",
    "megatron_args_text",
    "megatron_env",
    "megatron_entry",
    "priced_args",
]


def megatron_unsupported(plan: ParallelPlan) -> list[str]:
    """Why Megatron-LM cannot run ``plan`` as priced; [] when it can."""
    reasons: list[str] = expert_errors(plan, Framework.MEGATRON)
    if plan.ep > 1 and plan.framework is Framework.DEEPSPEED:
        reasons.append("its MoE dispatch was priced as DeepSpeed-MoE's einsums (use --framework megatron)")
    megatron_fsdp = plan.sharding is Sharding.FSDP_FULL and plan.framework is Framework.MEGATRON
    if plan.sharding not in (Sharding.NONE, Sharding.ZERO1) and not megatron_fsdp:
        reasons.append(
            f"Megatron's distributed optimizer shards optimizer states only, not {plan.sharding} "
            "(fsdp-full is Megatron-FSDP for --framework megatron plans)"
        )
    if megatron_fsdp and (plan.pp > 1 or plan.offload):
        reasons.append("Megatron-FSDP is emitted without pipelining or optimizer offload")
    if plan.pp > 1 and plan.schedule is Schedule.GPIPE:
        reasons.append("Megatron schedules pipelines with 1F1B or interleaved 1F1B, not GPipe")
    if plan.precision is Precision.FP8 and plan.fp8_recipe not in FP8_RECIPES[Framework.MEGATRON]:
        offered = ", ".join(_FP8_RECIPE.values())
        reasons.append(f"Megatron has no {plan.fp8_recipe} fp8 recipe (--fp8-recipe: {offered})")
    if _param_gather_overlapped(plan) and not plan.overlap_grad_reduce:
        reasons.append(
            "Megatron-LM's validate_args refuses --overlap-param-gather without --overlap-grad-reduce "
            "(Megatron-Bridge's DDP config runs it)"
        )
    return reasons


def _param_gather_overlapped(plan: ParallelPlan) -> bool:
    """The distributed optimizer gathers parameters bucket by bucket under the next forward."""
    return plan.overlap_param_gather and plan.sharding is Sharding.ZERO1 and plan.dp * plan.cp > 1


def _capacity_args(plan: ParallelPlan, model: ModelSpec) -> list[list[str]]:
    """Token dropping as priced (``costmodel.moe``): capacity ``c`` of the balanced load, every expert's input
    padded to it, which also skips the dropless dispatcher's host sync (``costmodel.moehost``)."""
    if not model.is_moe or plan.moe_capacity_factor is None:
        return []
    return [
        ["--moe-expert-capacity-factor", f"{plan.moe_capacity_factor:g}"],
        ["--moe-pad-expert-input-to-capacity"],
    ]


def _parallel_args(plan: ParallelPlan, model: ModelSpec) -> list[list[str]]:
    args = [
        ["--tensor-model-parallel-size", str(plan.tp)],
        ["--pipeline-model-parallel-size", str(plan.pp)],
        ["--context-parallel-size", str(plan.cp)],
    ]
    args += _split_args(plan, model)
    if plan.sequence_parallel:
        args.append(["--sequence-parallel"])
    if model.is_moe:  # Megatron's ETP defaults to TP; the plan's is explicit
        args += [
            ["--expert-model-parallel-size", str(plan.ep)],
            ["--expert-tensor-parallel-size", str(plan.etp)],
        ]

    if plan.sharding is Sharding.ZERO1:
        args.append(["--use-distributed-optimizer"])
    args += _overlap_args(plan)
    if plan.sharding is Sharding.FSDP_FULL:  # Megatron-FSDP, ZeRO-3 style: the user guide's required flags
        args += [  # (docs/discussions/megatron-fsdp-user-guide; validate_args asserts the checkpoint format)
            ["--use-megatron-fsdp"],
            ["--data-parallel-sharding-strategy", "optim_grads_params"],
            ["--no-gradient-accumulation-fusion"],
            ["--use-distributed-optimizer"],
            ["--ckpt-format", "fsdp_dtensor"],
        ]
    if plan.offload:  # Megatron's hybrid-device optimizer rides on the precision-aware optimizer path
        args += [
            ["--optimizer-cpu-offload"],
            ["--use-precision-aware-optimizer"],
            ["--optimizer-offload-fraction", "1.0"],
        ]
    return args


def _split_args(plan: ParallelPlan, model: ModelSpec) -> list[list[str]]:
    """Interleaving and the uneven split (megatron/training/arguments.py; ``autotune/stagesplit.py``)."""
    if plan.pp == 1:
        return []
    split = split_layers(model.num_layers, plan, mtp=model.mtp_layers)
    if split.uniform:
        if plan.schedule is not Schedule.INTERLEAVED:
            return []
        return [["--num-layers-per-virtual-pipeline-stage", str(split.chunk_layers[0])]]
    if split.method == LAYOUT:  # the layout implies the virtual stages (megatron/training/arguments.py)
        return [["--pipeline-model-parallel-layout", megatron_layout(split)]]
    args = (
        [["--num-virtual-stages-per-pipeline-rank", str(plan.virtual_stages)]]
        if plan.schedule is Schedule.INTERLEAVED
        else []
    )
    if split.method in (ACCOUNT_BOTH, ACCOUNT_LOSS):
        args.append(["--account-for-loss-in-pipeline-split"])
    if split.method == ACCOUNT_BOTH:
        args.append(["--account-for-embedding-in-pipeline-split"])
    if split.method == FIRST_LAST:
        args += [
            ["--decoder-first-pipeline-num-layers", str(split.first_rank_layers)],
            ["--decoder-last-pipeline-num-layers", str(split.last_rank_layers)],
        ]
    return args


_CP_COMM = {"p2p": "p2p", "allgather": "allgather", "a2a": "a2a"}
_FP8_RECIPE = {"tensorwise": "tensorwise", "delayed": "delayed", "blockwise": "blockwise", "mx": "mxfp8"}
"""ParallelPlan.fp8_recipe -> Megatron ``--fp8-recipe`` (megatron/training/arguments.py: tensorwise, delayed,
mxfp8, blockwise)."""


def _overlap_args(plan: ParallelPlan) -> list[list[str]]:
    """The overlaps the cost model assumes, turned on (megatron/training/arguments.py): ``--tp-comm-overlap``
    (TE userbuffers), ``--overlap-grad-reduce`` (DP x CP > 1, the group Megatron reduces gradients over;
    ``validate_args`` asserts it beside ``--overlap-param-gather``), ``--overlap-param-gather`` (needs the
    distributed optimizer), the CP exchange ``--cp-comm-type``, and the EP overlap
    ``--overlap-moe-expert-parallel-comm --delay-wgrad-compute`` (``costmodel.epoverlap``)."""
    args: list[list[str]] = []
    if plan.tp_comm_overlap:
        args.append(["--tp-comm-overlap"])
    if plan.overlap_grad_reduce and plan.dp * plan.cp > 1:  # Megatron reduces gradients over DP x CP
        args.append(["--overlap-grad-reduce"])
    if _param_gather_overlapped(plan):
        args.append(["--overlap-param-gather"])
    if plan.cp > 1:
        args.append(["--cp-comm-type", _CP_COMM[str(plan.cp_comm)]])
    if plan.moe_a2a_overlap:
        args += [["--overlap-moe-expert-parallel-comm"], ["--delay-wgrad-compute"]]
    return args


def _recompute_and_precision_args(plan: ParallelPlan) -> list[list[str]]:
    args: list[list[str]] = []
    if plan.recompute is Recompute.SELECTIVE:
        args.append(["--recompute-granularity", "selective"])
        if plan.recompute_modules:
            args.append(["--recompute-modules", *plan.recompute_modules])
    elif plan.recompute is Recompute.FULL and plan.recompute_layers is not None:
        args += [
            ["--recompute-granularity", "full"],
            ["--recompute-method", "block"],
            ["--recompute-num-layers", str(plan.recompute_layers)],
        ]
    elif plan.recompute is Recompute.FULL:
        args += [
            ["--recompute-granularity", "full"],
            ["--recompute-method", "uniform"],
            ["--recompute-num-layers", "1"],
        ]
    if plan.precision is Precision.FP16:
        args.append(["--fp16"])
    else:  # fp8 runs its GEMMs in fp8 (Transformer Engine) on top of bf16 everything else
        args.append(["--bf16"])
    if plan.precision is Precision.FP8:
        recipe = _FP8_RECIPE[str(plan.fp8_recipe)]
        args += [["--fp8-format", "hybrid"], ["--fp8-recipe", recipe]]
        if recipe == "delayed":  # amax history: delayed scaling only
            args += [["--fp8-amax-history-len", "1024"], ["--fp8-amax-compute-algo", "max"]]
    if plan.megatron_grad_dtype is GradDtype.BF16:  # bf16 main_grad buffer and DP reduction (states.py)
        args.append(["--grad-reduce-in-bf16"])
    if plan.loss_kernel is LossKernel.FUSED:  # Transformer Engine's cross-entropy (costmodel.lossmemory)
        args += [["--cross-entropy-loss-fusion"], ["--cross-entropy-fusion-impl", "te"]]
    return args


def _memory_args(plan: ParallelPlan) -> list[list[str]]:
    """Memory options of the plan (TransformerConfig / OptimizerConfig fields as flags): fine-grained
    activation offloading of the listed modules, activation CPU offload of N layers (the cost model prices
    activations only, as NeMo's performance scripts run it with ``cpu_offloading_weights=False``, that field's
    default at core_v0.16.1; ``--cpu-offloading-num-layers`` alone turns it on there, which has no
    ``--cpu-offloading`` flag) and the precision-aware optimizer
    (``costmodel.states.megatron_optimizer_bytes``)."""
    args: list[list[str]] = []
    if plan.offload_activation_layers:
        args.append(["--cpu-offloading-num-layers", str(plan.offload_activation_layers)])  # turns it on
    if plan.offload_modules:  # fine-grained activation offloading (costmodel.actoffload)
        args += [["--fine-grained-activation-offloading"], ["--offload-modules", *plan.offload_modules]]
    if plan.precision_aware_optimizer and not plan.offload:  # offload emits it with the hybrid optimizer
        args.append(["--use-precision-aware-optimizer"])
        if plan.moment_dtype is StoreDtype.BF16:  # bf16 Adam moments (states.megatron_optimizer_bytes)
            args += [["--exp-avg-dtype", "bf16"], ["--exp-avg-sq-dtype", "bf16"]]
        if plan.sharding is Sharding.NONE:  # DP x CP = 1: the distributed optimizer shards over one rank
            args.append(["--use-distributed-optimizer"])
    return args


def priced_args(plan: ParallelPlan) -> list[list[str]]:
    """Flags for what the cost model assumes and Megatron does not default to: no dropout (Megatron defaults
    to 0.1; ``costmodel/activations.py`` stores no dropout masks). The DP/TP overlaps the step-time model
    assumes are plan fields, emitted by ``_overlap_args``."""
    del plan  # the same for every plan today
    return [["--attention-dropout", "0"], ["--hidden-dropout", "0"]]


def megatron_env(plan: ParallelPlan, gpu: GPUSpec | None = None) -> dict[str, str]:
    """Environment Megatron needs at start-up: ``validate_args`` (core_v0.16.1,
    ``megatron/training/arguments.py``) asserts ``CUDA_DEVICE_MAX_CONNECTIONS=1`` with TP > 1 or CP > 1 on
    GPUs before Blackwell (compute capability < 10), so the TP/CP collectives are queued before the GEMMs
    they overlap with; on Blackwell the requirement is gone and the setting is harmless. The EP overlap
    (``plan.moe_a2a_overlap``) needs more than one connection (megatron/core/transformer/moe/README.md),
    and with it ``validate_args`` only warns about TP/CP: 32, as its warning suggests; so does Megatron-FSDP,
    which asserts more than one (its user guide unsets it: CUDA's default, 8). Fine-grained activation
    offloading under Transformer Engine 2.10 or later needs ``NVTE_CPU_OFFLOAD_V1=1`` (asserted; with TE's
    newer offload path weights would move too). ``--tp-comm-overlap``
    on a ``gpu`` below compute capability 9.0 (no CUDA multicast) also needs ``UB_SKIPMC=1``: Transformer
    Engine's ``initialize_ub`` asserts otherwise and falls back to CUDA IPC with it
    (examples/pytorch/comm_gemm_overlap/README.md)."""
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if plan.tp > 1 or plan.cp > 1 else {}
    if plan.moe_a2a_overlap:  # it runs two streams at once; validate_args then only warns on TP/CP
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "32"
    if plan.sharding is Sharding.FSDP_FULL:  # Megatron-FSDP: validate_args asserts it is not 1
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "8"  # CUDA's default, what its user guide's `unset` leaves
    if plan.offload_modules:  # validate_args (TE >= 2.10) asserts it; older TE ignores it
        env["NVTE_CPU_OFFLOAD_V1"] = "1"
    cc = gpu.compute_capability if gpu is not None else None
    if plan.tp_comm_overlap and plan.tp > 1 and cc is not None and cc < 9.0:
        env["UB_SKIPMC"] = "1"
    return env


def _check_rules(plan: ParallelPlan, model: ModelSpec) -> None:
    reason = split_error(
        model.num_layers, plan.pp, plan.virtual_stages, str(plan.framework), model.mtp_layers
    )
    if reason:
        raise ConfigError(f"Megatron: {reason}")
    if plan.offload_activation_layers >= model.num_layers:
        raise ConfigError(
            f"Megatron: --cpu-offloading-num-layers {plan.offload_activation_layers} must be "
            f"below the {model.num_layers} layers (TransformerConfig)"
        )
    if plan.global_batch % (plan.micro_batch * plan.dp):
        raise ConfigError(
            f"Megatron: --global-batch-size {plan.global_batch} is not divisible by "
            f"--micro-batch-size x DP = {plan.micro_batch} x {plan.dp}"
        )


def megatron_args(plan: ParallelPlan, model: ModelSpec) -> list[list[str]]:
    """Flag groups (``[flag]`` or ``[flag, value]``) for ``plan``; ``ConfigError`` if Megatron cannot."""
    reasons = megatron_unsupported(plan)
    if reasons:
        raise ConfigError(f"Megatron-LM cannot express this plan: {reasons[0]}")
    _check_rules(plan, model)
    batch = [["--micro-batch-size", str(plan.micro_batch)], ["--global-batch-size", str(plan.global_batch)]]
    return (
        _parallel_args(plan, model)
        + batch
        + model_args(model, plan.seq_len, plan.moe_dispatcher)
        + _capacity_args(plan, model)
        + _recompute_and_precision_args(plan)
        + _memory_args(plan)
        + priced_args(plan)
    )


def megatron_args_text(plan: ParallelPlan, model: ModelSpec) -> str:
    return "".join(" ".join(group) + "\n" for group in megatron_args(plan, model))
