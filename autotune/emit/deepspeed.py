"""ParallelPlan -> DeepSpeed ``ds_config.json`` (pure; checked against ``tests/golden/*.json``).

DeepSpeed validates a config with bare ``assert``s (gone under ``python -O``) and ignores unknown top-level
keys, so this module checks the batch rule ``train_batch_size == micro x accumulation x DP`` itself and emits
only the keys in ``DS_TOP_LEVEL_KEYS``. No value is ``"auto"``: that is an accelerate/HF convention that plain
DeepSpeed cannot resolve. Layout follows DeepSpeed's ``config_templates/template_zero*.json``.
"""

from __future__ import annotations

from typing import Any

from autotune.errors import ConfigError
from autotune.plan import (
    CpComm,
    Framework,
    ParallelPlan,
    Precision,
    Recompute,
    Schedule,
    Sharding,
    expert_errors,
)
from autotune.specs import ModelSpec

__all__ = [
    "DS_TOP_LEVEL_KEYS",
    "GRADIENT_CLIPPING",
    "deepspeed_unsupported",
    "to_ds_config",
    "check_ds_config",
]

GRADIENT_CLIPPING = 1.0
"""Global-norm clipping, the Llama/GPT-3 recipe value; every emitted artefact uses the same."""

DS_TOP_LEVEL_KEYS = frozenset(
    {
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "gradient_clipping",
        "steps_per_print",
        "bf16",
        "fp16",
        "zero_optimization",
        "zero_allow_untested_optimizer",
        "activation_checkpointing",
        "pipeline",
        "tensor_parallel",
        "sequence_parallel_size",
    }
)
"""Every key ``to_ds_config`` may emit; each is read by ``deepspeed.runtime.config`` (a test checks that)."""

_FP16 = {
    "enabled": True,
    "loss_scale": 0,
    "initial_scale_power": 16,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1,
}
"""Dynamic loss scaling (``loss_scale: 0``) with DeepSpeed's documented defaults spelled out."""


def deepspeed_unsupported(plan: ParallelPlan) -> list[str]:
    """Why DeepSpeed cannot run ``plan`` as the cost model priced it; [] when it can."""
    reasons: list[str] = expert_errors(plan, Framework.DEEPSPEED)
    if plan.ep > 1 and plan.framework is not Framework.DEEPSPEED:
        reasons.append(
            f"the plan's MoE dispatch was priced as {plan.framework}'s; DeepSpeed-MoE's dense einsum "
            "dispatch is priced for --framework deepspeed plans"
        )
    if plan.sharding is Sharding.FSDP_GRAD_OP:
        reasons.append(
            "fsdp-grad-op reshards parameters between steps; ZeRO-2 keeps them whole, "
            "so its memory differs from the plan"
        )
    if plan.sharding is Sharding.HSDP:
        reasons.append("hsdp needs DeepSpeed MiCS (zero.MiCS_Init in the model code), not a config alone")
    if plan.cp > 1 and (plan.cp_comm is not CpComm.A2A or plan.pp > 1 or plan.tp > 1):
        reasons.append("DeepSpeed's context parallelism is Ulysses: cp-comm a2a, PP = TP = 1")
    if plan.precision is Precision.FP8:
        reasons.append("DeepSpeed's engine has no fp8 training path")
    if plan.sequence_parallel:
        reasons.append("AutoTP does not split norms/dropout over the TP group (Megatron sequence parallel)")
    if plan.pp > 1:
        reasons += _pipeline_unsupported(plan)
    return reasons


def _pipeline_unsupported(plan: ParallelPlan) -> list[str]:
    reasons: list[str] = []
    if plan.zero_stage > 1:
        reasons.append("DeepSpeed's pipeline engine rejects ZeRO-2/3")
    if plan.tp > 1:
        reasons.append("DeepSpeed pipeline + AutoTP fails in the pipeline engine")
    if plan.schedule is not Schedule.ONE_F_ONE_B:
        reasons.append(f"DeepSpeed's pipeline engine runs 1F1B only, not {plan.schedule}")
    return reasons


def _zero_section(plan: ParallelPlan) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": plan.zero_stage}
    # under PP the engine switches overlap_comm off (runtime/engine.py); PP allows ZeRO-0/1 only, whose
    # reduction costmodel/dpcomm.py prices as exposed anyway
    if plan.zero_stage > 0:
        zero.update(overlap_comm=plan.pp == 1, contiguous_gradients=True)
    if plan.offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    return zero


def _precision_section(plan: ParallelPlan) -> dict[str, Any]:
    if plan.precision is Precision.FP16:
        return {"fp16": dict(_FP16)}
    return {"bf16": {"enabled": True}}


def _parallel_sections(plan: ParallelPlan) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if plan.pp > 1:  # PipelineEngine reads the checkpoint interval; stages and partition are PipelineModule's
        interval = 1 if plan.recompute is not Recompute.NONE else 0
        out["pipeline"] = {"activation_checkpoint_interval": interval}
    if plan.tp > 1:
        out["tensor_parallel"] = {"autotp_size": plan.tp}
    if plan.cp > 1:  # DeepSpeed-Ulysses: ZeRO and the batch size follow the sequence-data-parallel group
        out["sequence_parallel_size"] = plan.cp
    if plan.recompute is not Recompute.NONE:
        out["activation_checkpointing"] = {
            "partition_activations": False,
            "cpu_checkpointing": False,
            "contiguous_memory_optimization": False,
        }
    return out


def to_ds_config(plan: ParallelPlan, model: ModelSpec | None = None) -> dict[str, Any]:
    """The DeepSpeed config for ``plan``; ``ConfigError`` if DeepSpeed cannot express it.

    ``model`` is accepted for symmetry with the other emitters; a DeepSpeed config does not describe the
    model. ``train_batch_size`` is always the plan's global batch. With AutoTP (TP > 1) DeepSpeed 0.19 checks
    it against micro x accumulation x the mpu's DP size, or without an mpu x the world size (TP ranks
    counted): then it rejects the value, and left out it derives TP times the plan's batch for its sample
    counters. The script passes ``mpu=deepspeed.utils.groups`` (``summary.md`` says how).
    """
    del model
    reasons = deepspeed_unsupported(plan)
    if reasons:
        raise ConfigError(f"DeepSpeed cannot express this plan: {reasons[0]}")
    cfg: dict[str, Any] = {}
    cfg["train_batch_size"] = plan.global_batch
    cfg["train_micro_batch_size_per_gpu"] = plan.micro_batch
    cfg["gradient_accumulation_steps"] = plan.grad_accum
    cfg["gradient_clipping"] = GRADIENT_CLIPPING
    cfg["steps_per_print"] = 100
    cfg.update(_precision_section(plan))
    cfg["zero_optimization"] = _zero_section(plan)
    if plan.zero_stage > 0:  # ZeRO wraps the user's torch optimizer; DeepSpeed calls that "untested"
        cfg["zero_allow_untested_optimizer"] = True
    cfg.update(_parallel_sections(plan))
    check_ds_config(cfg, dp=plan.dp, global_batch=plan.global_batch)
    return cfg


def check_ds_config(cfg: dict[str, Any], *, dp: int, global_batch: int) -> None:
    """What DeepSpeed checks with bare asserts (or not at all), as ``ConfigError``s."""
    unknown = sorted(set(cfg) - DS_TOP_LEVEL_KEYS)
    if unknown:
        raise ConfigError(
            f"ds_config: key '{unknown[0]}' is not one autotune emits (DeepSpeed would ignore it)"
        )
    micro, accum = cfg.get("train_micro_batch_size_per_gpu"), cfg.get("gradient_accumulation_steps")
    if not isinstance(micro, int) or not isinstance(accum, int) or micro < 1 or accum < 1:
        raise ConfigError("ds_config: micro-batch and gradient accumulation must be positive integers")
    batch = cfg.get("train_batch_size", micro * accum * dp)
    if batch != micro * accum * dp or batch != global_batch:
        raise ConfigError(
            f"ds_config: train_batch_size {batch} != micro {micro} x accumulation {accum} x "
            f"DP {dp} (global batch {global_batch})"
        )
    if _has_auto(cfg):
        raise ConfigError("ds_config: 'auto' is an accelerate convention; plain DeepSpeed needs numbers")


def _has_auto(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_has_auto(v) for v in value.values())
    return isinstance(value, str) and value == "auto"
