"""Legality of Megatron's memory options, stated once for ``legality.plan_errors`` (and, where the model
decides, ``recompute_modules_model_errors`` for ``legality.check_plan``):
``--recompute-num-layers``, ``--recompute-modules``, activation offload (whole layers or the listed modules),
the precision-aware optimizer and the gradient dtype; and framework fsdp's stored dtypes (weights, Adam
moments, loss). Each message names the flag and what would satisfy it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.legalrules import megatron_optimizer_broken, megatron_runs_stores, store_dtype_broken
from autotune.planenums import (
    MEGATRON_OFFLOAD_MODULES,
    OFFLOAD_MODULES,
    RECOMPUTE_MODULES,
    Fp8Recipe,
    Framework,
    LossKernel,
    Precision,
    Recompute,
    StoreDtype,
)
from autotune.specs import ModelSpec

if TYPE_CHECKING:
    from autotune.plan import ParallelPlan

__all__ = ["memory_option_errors", "recompute_modules_model_errors"]


def memory_option_errors(plan: ParallelPlan) -> list[str]:
    """The rules of the memory options the plan sets."""
    errors: list[str] = []
    if plan.recompute_layers is not None:
        errors += _recompute_layers_errors(plan)
    if plan.recompute_modules:
        errors += _recompute_modules_errors(plan)
    if plan.offload_modules:
        errors += _offload_modules_errors(plan)
    return errors + _megatron_memory_option_errors(plan) + _store_dtype_errors(plan)


def _store_dtype_errors(plan: ParallelPlan) -> list[str]:
    """bf16 weights or moments, a loss kernel other than eager fp32 (``legalrules.store_dtype_broken``)."""
    chosen = plan.numerics_flags
    megatron = {f"--loss-kernel {LossKernel.FUSED}"} | (  # to name the first flag Megatron does not run
        {f"--adam-dtype {StoreDtype.BF16}"} if plan.precision_aware_optimizer else set()
    )
    megatron_ok = megatron_runs_stores(
        plan.weight_dtype, plan.adam_dtype, plan.loss_kernel, precision_aware=plan.precision_aware_optimizer
    )
    broken = store_dtype_broken(plan.framework, plan.precision, bool(chosen), megatron_ok=megatron_ok)
    if broken == "framework":
        first = (
            next(c for c in chosen if c not in megatron)
            if plan.framework is Framework.MEGATRON
            else chosen[0]
        )
        return [
            f"{first} needs --framework fsdp (Megatron and DeepSpeed keep fp32 master weights and "
            "moments and run their own cross-entropy; Megatron takes --loss-kernel fused, Transformer "
            "Engine's, and --adam-dtype bf16 with --precision-aware-optimizer)"
        ]
    if broken == "fp16":
        return [f"{chosen[0]} needs --precision bf16 or fp8, not fp16"]
    if plan.loss_kernel is LossKernel.CHUNKED and plan.tp > 1:  # Liger's kernel takes the whole vocabulary
        return ["--loss-kernel chunked needs --tp 1 (Liger's linear cross-entropy is not vocab-parallel)"]
    return []


def _recompute_modules_errors(plan: ParallelPlan) -> list[str]:
    """Megatron-Core 0.16.1's ``TransformerConfig.__post_init__``: known modules, selective granularity; no
    ``moe_act`` or ``layernorm`` under fp8 delayed scaling ("Delayed scaling does not support ...")."""
    bad = [m for m in plan.recompute_modules if m not in RECOMPUTE_MODULES]
    if bad:
        return [f"recompute-modules: unknown module {bad[0]!r}; allowed: {', '.join(RECOMPUTE_MODULES)}"]
    if plan.recompute is not Recompute.SELECTIVE or plan.framework is not Framework.MEGATRON:
        return [
            "recompute-modules needs --recompute selective and --framework megatron "
            "(Megatron's --recompute-granularity selective --recompute-modules)"
        ]
    delayed = plan.precision is Precision.FP8 and plan.fp8_recipe is Fp8Recipe.DELAYED
    if delayed and (quantized := {"moe_act", "layernorm"} & set(plan.recompute_modules)):
        return [
            f"recompute-modules {' '.join(sorted(quantized))} does not run with fp8 delayed scaling "
            "(Megatron's TransformerConfig); use --fp8-recipe tensorwise"
        ]
    return []


def recompute_modules_model_errors(plan: ParallelPlan, model: ModelSpec) -> list[str]:
    """Modules the model lacks, as ``TransformerConfig`` refuses them: ``mla_up_proj`` without multi-latent
    attention, ``moe_act`` without MoE layers (it needs ``moe_grouped_gemm``, which autotune sets on MoE
    models only)."""
    errors = []
    if "mla_up_proj" in plan.recompute_modules and not model.uses_mla:
        errors.append(
            "recompute-modules mla_up_proj needs a model with multi-latent attention "
            "(Megatron's transformer_config.py refuses it otherwise)"
        )
    if "moe_act" in plan.recompute_modules and not model.is_moe:
        errors.append(
            f"recompute-modules moe_act needs MoE layers (Megatron's grouped GEMM); {model.name} has none"
        )
    return errors


def _offload_modules_errors(plan: ParallelPlan) -> list[str]:
    """Megatron's fine-grained activation offloading (``TransformerConfig.__post_init__``): Megatron only, not
    with layer-level ``--cpu-offloading``, nothing inside a fully recomputed MoE layer; modules autotune does
    not price are refused by name."""
    priced = ", ".join(OFFLOAD_MODULES)
    for m in plan.offload_modules:
        if m not in MEGATRON_OFFLOAD_MODULES:
            return [f"offload-modules: unknown module {m!r}; priced: {priced}"]
        if m not in OFFLOAD_MODULES:
            return [f"offload-modules: {m} is a Megatron module autotune does not price; priced: {priced}"]
    if plan.framework is not Framework.MEGATRON:
        return ["offload-modules needs --framework megatron (its --fine-grained-activation-offloading)"]
    if plan.offload_activation_layers:
        return [
            "offload-modules does not run with offload-activation-layers (Megatron: fine-grained "
            "activation offloading cannot be enabled with cpu_offloading); use one"
        ]
    if plan.recompute is Recompute.FULL or "moe" in plan.recompute_modules:
        return [
            "offload-modules: the MoE layer is recomputed whole (full recompute or moe in "
            "--recompute-modules), so nothing inside it is kept to offload; drop one"
        ]
    return []


def _megatron_memory_option_errors(plan: ParallelPlan) -> list[str]:
    """Activation offload and the precision-aware optimizer are Megatron options; Megatron's
    ``TransformerConfig.__post_init__`` rejects CPU offloading with pipeline parallelism or recompute."""
    n = plan.offload_activation_layers
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        return [f"offload-activation-layers must be a non-negative integer, got {n!r}"]
    errors = []
    if n and (plan.framework is not Framework.MEGATRON or plan.pp > 1):
        errors.append(
            "offload-activation-layers needs --framework megatron and --pp 1 (Megatron's "
            "--cpu-offloading-num-layers does not support pipeline parallelism)"
        )
    elif n and plan.recompute is not Recompute.NONE:  # TransformerConfig.__post_init__ raises it
        errors.append(
            "offload-activation-layers needs --recompute none (Megatron: CPU offloading does not work "
            "when activation recomputation is enabled)"
        )
    broken = megatron_optimizer_broken(
        plan.framework,
        plan.sharding,
        plan.dp,
        plan.cp,
        precision_aware=plan.precision_aware_optimizer,
        grad_reduce=plan.grad_reduce_dtype is not None,
    )
    if broken and plan.precision_aware_optimizer:
        errors.append(
            "precision-aware-optimizer needs --framework megatron and its distributed optimizer "
            "(--sharding zero1 or fsdp-full, or DP x CP = 1): Megatron's "
            "--use-precision-aware-optimizer"
        )
    if broken == "framework" and plan.grad_reduce_dtype is not None:
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
