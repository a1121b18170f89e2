"""Legality of the token mixers beside softmax attention (Gated DeltaNet, Mamba-2), stated once for
``legality.check_plan``: what a plan asks of them that is not priced or does not run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.planenums import Framework
from autotune.specs import ModelSpec

if TYPE_CHECKING:
    from autotune.plan import ParallelPlan

__all__ = ["mixer_errors", "linear_attention_broken", "mamba_broken"]


def mixer_errors(plan: ParallelPlan, model: ModelSpec) -> list[str]:
    """The first reason of each mixer kind the model has ([] when the plan runs and is priced)."""
    autotp = plan.framework is Framework.DEEPSPEED and plan.tp > 1
    linear = linear_attention_broken(
        model, plan.tp, plan.cp, str(plan.recompute), plan.recompute_modules, autotp
    )
    mamba = mamba_broken(
        model, plan.tp, plan.cp, plan.pp, plan.framework, str(plan.recompute), plan.virtual_stages
    )
    return [reason for reason in (linear, mamba) if reason]


def linear_attention_broken(
    model: ModelSpec, tp: int, cp: int, recompute: str, modules: tuple[str, ...], autotp: bool = False
) -> str:
    """What a plan of a model with Gated DeltaNet layers asks that is not priced (empty when nothing): TP
    must divide its key heads (Megatron-Core and transformers split them with the value heads), and
    DeepSpeed's AutoTP, which splits each linear by its columns, does not know the fused ``in_proj_qkvz``
    groups; context parallelism, selective recompute and recompute modules of those layers are not priced."""
    if not model.num_linear_layers:
        return ""
    if model.linear_key_heads % tp:  # the reason's head (before ':') is the tally's rule: no numbers in it
        return f"TP does not divide the Gated DeltaNet key heads: TP {tp}, {model.linear_key_heads} key heads"
    if autotp:
        return "DeepSpeed AutoTP of Gated DeltaNet layers is not priced: use --tp 1 or --framework megatron"
    if cp > 1:
        return "context parallelism of Gated DeltaNet layers is not priced: use --cp 1"
    if recompute == "selective" or modules:
        return "selective recompute of Gated DeltaNet layers is not priced: use --recompute none or full"
    return ""


def mamba_broken(
    model: ModelSpec, tp: int, cp: int, pp: int, framework: Framework, recompute: str, virtual_stages: int
) -> str:
    """What a plan of a model with Mamba-2 layers asks that is not priced or does not run (empty when
    nothing): TP must divide the SSD heads and the B/C groups (Megatron-Core ``MambaMixer`` splits both over
    TP and asserts it); DeepSpeed's AutoTP, which splits each linear by its columns, does not know the fused
    ``in_proj``; Megatron-Core 0.16's ``MambaStack`` has no full-recompute path (``recompute_granularity``
    full is accepted and checkpoints nothing: core_v0.18 adds it), asserts no virtual pipeline and splits the
    pattern's characters evenly over PP (``mamba_block.py``; each stage priced as the mean layer); context
    parallelism of Mamba layers and torchtitan's op-level SAC are not priced. Megatron's selective recompute
    and its modules act on the attention, MLP and MoE layers only, as ``recompute_modules`` prices them."""
    if not model.mamba_heads:
        return ""
    for what, n in (("SSD heads", model.mamba_heads), ("B/C groups", model.mamba_groups)):
        if n % tp:
            return f"TP does not divide the Mamba {what}: TP {tp}, {n} {what}"
    if framework is Framework.DEEPSPEED and tp > 1:
        return "DeepSpeed AutoTP of Mamba layers is not priced: use --tp 1 or --framework megatron"
    if cp > 1:
        return "context parallelism of Mamba layers is not priced: use --cp 1"
    if framework is Framework.MEGATRON and recompute == "full":
        return (
            "Megatron-Core's MambaStack has no full recompute: in 0.16 it checkpoints nothing; "
            "use --recompute selective or none"
        )
    if framework is Framework.MEGATRON and virtual_stages > 1:
        return "Megatron-Core's MambaStack refuses virtual pipeline stages: use --virtual-stages 1"
    if framework is Framework.MEGATRON and model.num_layers % pp:
        return (
            f"PP does not divide a hybrid pattern's layers: Megatron splits its {model.num_layers} "
            f"characters evenly over PP {pp} (MambaStack; Megatron-LM asserts num_layers % PP == 0)"
        )
    if framework is Framework.FSDP and recompute == "selective":
        return "op-level selective recompute of Mamba layers is not priced: use --recompute none or full"
    return ""
