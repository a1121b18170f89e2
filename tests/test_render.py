"""``render.plan_summary``: the one line every command prints for a plan names each field that differs from
its default, so two plans never print the same line."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.plan import ParallelPlan
from autotune.render import plan_summary

MEGATRON = ParallelPlan(
    tp=2,
    pp=2,
    dp=4,
    cp=2,
    ep=2,
    global_batch=64,
    seq_len=4096,
    framework="megatron",
    sharding="zero1",
    precision="fp8",
    sequence_parallel=True,
    schedule="interleaved",
    virtual_stages=2,
)
MEGATRON_PP1 = dataclasses.replace(MEGATRON, pp=1, dp=8, schedule="1f1b", virtual_stages=1)
FSDP = ParallelPlan(tp=2, dp=4, global_batch=64, seq_len=4096, sharding="fsdp-full")

VARIANTS: dict[str, tuple[ParallelPlan, dict[str, object]]] = {
    "tp": (FSDP, {"tp": 4, "dp": 2}),
    "pp": (MEGATRON, {"pp": 4, "dp": 2}),
    "dp": (FSDP, {"dp": 8, "global_batch": 128}),
    "cp": (MEGATRON, {"cp": 4, "dp": 2}),
    "micro_batch": (FSDP, {"micro_batch": 2}),
    "sharding": (MEGATRON, {"sharding": "none"}),
    "hsdp_shard_size": (FSDP, {"sharding": "hsdp", "hsdp_shard_size": 2}),
    "recompute": (FSDP, {"recompute": "full"}),
    "sequence_parallel": (MEGATRON, {"sequence_parallel": False}),
    "schedule": (MEGATRON, {"schedule": "1f1b", "virtual_stages": 1}),
    "virtual_stages": (MEGATRON, {"virtual_stages": 4}),
    "offload": (FSDP, {"offload": True}),
    "precision": (MEGATRON, {"precision": "bf16"}),
    "framework": (FSDP, {"framework": "megatron", "sharding": "zero1"}),
    "fp8_recipe": (MEGATRON, {"fp8_recipe": "mx"}),
    "compile": (FSDP, {"compile": True}),
    "async_tp": (FSDP, {"compile": True, "async_tp": True}),
    "tp_comm_overlap": (MEGATRON, {"tp_comm_overlap": True}),
    "overlap_grad_reduce": (MEGATRON, {"overlap_grad_reduce": False}),
    "overlap_param_gather": (MEGATRON, {"overlap_param_gather": False}),
    "cp_comm": (MEGATRON, {"cp_comm": "a2a"}),
    "ep": (MEGATRON, {"ep": 4}),
    "etp": (MEGATRON, {"etp": 2}),
    "recompute_layers": (MEGATRON, {"recompute": "full", "recompute_layers": 2}),
    "moe_dispatcher": (MEGATRON, {"moe_dispatcher": "deepep"}),
    "recompute_modules": (MEGATRON, {"recompute": "selective", "recompute_modules": ("mlp",)}),
    "offload_activation_layers": (MEGATRON_PP1, {"offload_activation_layers": 2}),
    "offload_modules": (MEGATRON, {"offload_modules": ("expert_fc1",)}),
    "precision_aware_optimizer": (MEGATRON, {"precision_aware_optimizer": True}),
    "grad_reduce_dtype": (MEGATRON, {"grad_reduce_dtype": "fp32"}),
    "weight_dtype": (FSDP, {"weight_dtype": "bf16"}),
    "adam_dtype": (FSDP, {"adam_dtype": "bf16"}),
    "loss_kernel": (FSDP, {"loss_kernel": "fused"}),
    "moe_capacity_factor": (MEGATRON, {"moe_capacity_factor": 1.0}),
    "moe_a2a_overlap": (MEGATRON, {"moe_a2a_overlap": True}),
    "moe_load_imbalance": (MEGATRON, {"moe_load_imbalance": 1.2}),
}
OWN_LINE = {"global_batch", "seq_len"}  # the "batch" line of estimate and the study's header print them


def test_every_plan_field_has_a_variant():
    fields = {f.name for f in dataclasses.fields(ParallelPlan)}
    assert fields - OWN_LINE == set(VARIANTS)


@pytest.mark.parametrize("field", list(VARIANTS))
def test_a_changed_field_changes_the_line(field):
    base, changes = VARIANTS[field]
    changed = dataclasses.replace(base, **changes)
    assert getattr(changed, field) != getattr(base, field)
    assert plan_summary(changed) != plan_summary(base)


def test_the_knobs_read_as_words():
    plan = dataclasses.replace(MEGATRON, tp_comm_overlap=True, fp8_recipe="mx", cp_comm="a2a")
    line = plan_summary(plan)
    assert "tp-overlap" in line.split() and "fp8/mx" in line.split() and "CP2/a2a" in line.split()
    assert "fp8" not in plan_summary(FSDP)  # the recipe is read only with fp8
