"""ParallelPlan -> accelerate FSDP2 config (``accelerate_fsdp.yaml``; pure).

The keys are those ``accelerate config`` writes and ``accelerate launch --config_file`` reads: top-level
``ClusterConfig`` fields, ``fsdp_config`` entries that match ``--fsdp_*`` launch flags (accelerate ignores a
mistyped one silently, so a test checks each against the launch parser) and, for HSDP/TP/CP, a
``parallelism_config`` block. ``fsdp_sharding_strategy`` is emitted next to the FSDP2 keys because
``accelerate launch`` exports ``FSDP_SHARDING_STRATEGY=FULL_SHARD`` by default and an FSDP1 user would
silently get full sharding for a ``fsdp-grad-op`` plan.

Wrapping: ``TRANSFORMER_BASED_WRAP`` around one decoder block class, ``LlamaDecoderLayer`` for Llama-style
models (RMSNorm, SwiGLU, no biases: the catalog's default family) and ``GPT2Block`` for GPT-style ones
(learned positions, biases). Other Hugging Face families name their block differently: edit
``fsdp_transformer_layer_cls_to_wrap``.
"""

from __future__ import annotations

from typing import Any

from autotune.errors import ConfigError
from autotune.plan import CpComm, Fp8Recipe, ParallelPlan, Precision, Recompute, Sharding
from autotune.specs import ClusterSpec, ModelSpec

__all__ = ["accelerate_unsupported", "to_accelerate_config", "transformer_layer_cls"]

_FSDP_SHARDINGS = {Sharding.FSDP_FULL, Sharding.FSDP_GRAD_OP, Sharding.HSDP, Sharding.ZERO3}
_FSDP1_STRATEGY = {
    Sharding.FSDP_FULL: "FULL_SHARD",
    Sharding.ZERO3: "FULL_SHARD",
    Sharding.FSDP_GRAD_OP: "SHARD_GRAD_OP",
    Sharding.HSDP: "HYBRID_SHARD",
}


def transformer_layer_cls(model: ModelSpec) -> str:
    """The Hugging Face decoder-block class FSDP wraps one unit around (see the module docstring)."""
    return "GPT2Block" if model.learned_positions or model.bias else "LlamaDecoderLayer"


def accelerate_unsupported(plan: ParallelPlan) -> list[str]:
    """Why accelerate + FSDP2 cannot run ``plan`` as priced; [] when it can."""
    reasons: list[str] = []
    if plan.ep > 1 or plan.etp > 1:
        reasons.append("accelerate's FSDP plugin has no expert parallelism (torchtitan.toml has it)")
    if plan.moe_capacity_factor is not None:
        reasons.append("the plan drops tokens at a capacity factor; FSDP2 runs the model's own MoE as is")
    if plan.sharding not in _FSDP_SHARDINGS:
        what = (
            "no sharding is plain DDP (accelerate launch --multi_gpu)"
            if plan.sharding is Sharding.NONE
            else f"FSDP has no {plan.sharding} (optimizer-only or gradient-only) sharding"
        )
        reasons.append(what)
    if plan.precision is Precision.FP8 and plan.fp8_recipe is not Fp8Recipe.TENSORWISE:
        reasons.append(f"accelerate's torchao fp8 (backend AO) scales tensorwise, not {plan.fp8_recipe}")
    if plan.pp > 1:
        reasons.append("accelerate's FSDP path has no pipeline parallelism (PP > 1)")
    if plan.offload:
        reasons.append("FSDP2 offload moves parameters and gradients too, not only the optimizer states")
    if plan.recompute is Recompute.SELECTIVE:
        reasons.append("fsdp_activation_checkpointing recomputes whole blocks (full), not selectively")
    if plan.sequence_parallel:
        reasons.append("accelerate's TP uses the model's tp_plan, which has no Megatron sequence parallel")
    if plan.cp > 1 and plan.cp_comm is CpComm.A2A:
        reasons.append("accelerate's FSDP context parallelism is torch's ring attention, not Ulysses (a2a)")
    return reasons


def _parallelism_config(plan: ParallelPlan) -> dict[str, int] | None:
    """Replicate x shard x TP x CP sizes; None for plain FSDP over every rank (accelerate's default)."""
    if plan.sharding is not Sharding.HSDP and plan.tp == 1 and plan.cp == 1:
        return None
    shard = plan.shard_degree
    return {
        "parallelism_config_dp_replicate_size": plan.dp // shard,
        "parallelism_config_dp_shard_size": shard,
        "parallelism_config_tp_size": plan.tp,
        "parallelism_config_cp_size": plan.cp,
    }


def _fsdp_section(plan: ParallelPlan, model: ModelSpec) -> dict[str, Any]:
    return {
        "fsdp_version": 2,
        "fsdp_reshard_after_forward": plan.sharding is not Sharding.FSDP_GRAD_OP,
        "fsdp_sharding_strategy": _FSDP1_STRATEGY[plan.sharding],
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": transformer_layer_cls(model),
        "fsdp_activation_checkpointing": plan.recompute is Recompute.FULL,
        "fsdp_offload_params": False,
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_cpu_ram_efficient_loading": True,
    }


def to_accelerate_config(plan: ParallelPlan, model: ModelSpec, cluster: ClusterSpec) -> dict[str, Any]:
    """The accelerate config for ``plan``; ``ConfigError`` if accelerate cannot express it."""
    reasons = accelerate_unsupported(plan)
    if reasons:
        raise ConfigError(f"accelerate FSDP cannot express this plan: {reasons[0]}")
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP",
        "mixed_precision": str(plan.precision),
        "num_machines": cluster.num_nodes,
        "num_processes": cluster.num_gpus,
        "machine_rank": 0,
        "main_training_function": "main",
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
        "downcast_bf16": "no",
        "fsdp_config": _fsdp_section(plan, model),
    }
    if plan.precision is Precision.FP8:  # torchao float8 (the FSDP2 path): fp8 all-gathers of sharded weights
        cfg["fp8_config"] = {"backend": "AO", "enable_fsdp_float8_all_gather": True}
    parallelism = _parallelism_config(plan)
    if parallelism:
        cfg["parallelism_config"] = parallelism
    return cfg
