"""``stage_states`` keeps states by the plan fields they read: the fields it leaves out change no state."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from autotune.catalog import load_model, make_cluster
from autotune.costmodel import stagestates
from autotune.costmodel.stagestates import NOT_READ, ranks_to_check, stage_states
from autotune.costmodel.states import FP32, MIXED_BF16
from autotune.errors import ConfigError
from autotune.plan import ParallelPlan
from autotune.space import PlanContext, enumerate_plans, load_space, resolve_choices

# Values each left-out field is set to beyond what the spaces offer (fields the user sets, never tuned).
_EXTRA = {
    "recompute_layers": (None, 1, 2),
    "recompute_modules": ((), ("core_attn",), ("mlp",)),
    "offload_activation_layers": (0, 1),
    "offload_modules": ((), ("expert_fc1",), ("moe_act",)),
    "moe_capacity_factor": (None, 1.0, 1.5),
    "moe_load_imbalance": (1.0, 1.4),
    "loss_kernel": ("fp32", "bf16", "fused", "chunked"),
    "compile": (False, True),
    "async_tp": (False, True),
    "overlap_grad_reduce": (True, False),
    "overlap_param_gather": (True, False),
}
_WITH = {"async_tp": {"compile": True}}  # async TP runs compiled; compile is left out of the key too


def _fresh(model, plan, numerics, rank):
    stagestates._KEPT = (None, None, {})  # computed, not found
    return stage_states(model, plan, numerics, rank=rank)


def _plans():
    """Every 61st ladder's first two plans of four spaces: dense ZeRO/FSDP/offload/pipelines, fp8 and 126
    uneven layers, experts over EP, DeepSeek-V3's MLA and multi-token prediction."""
    cases = [
        ("70b", 16, "a100-40gb", {}),
        ("llama3-405b", 64, "h100-sxm", {"precision": "fp8"}),
        ("mixtral-8x7b", 16, "h100-sxm", {"recompute": "none", "async_tp": False}),
        ("deepseek-v3", 32, "h100-sxm", {"recompute": "none", "tp_comm_overlap": False, "cp_comm": "p2p"}),
    ]
    for name, gpus, gpu, pins in cases:
        model, cluster = load_model(name), make_cluster(num_gpus=gpus, gpu=gpu)
        choices = resolve_choices(load_space(), model, cluster, pins)
        ctx = PlanContext(model=model, cluster=cluster, global_batch=4 * gpus, seq_len=4096)
        for i, ladder in enumerate(enumerate_plans(choices, ctx)):
            if i % 61 == 0:
                yield model, [ladder.plan(m) for m in ladder.micro_batches[:2]]


@pytest.mark.slow  # ~10 s: four spaces enumerated, each left-out field varied on every sampled plan
def test_the_fields_left_out_of_the_key_change_no_stages_states():
    every = {f.name: set() for f in dataclasses.fields(ParallelPlan) if f.name in NOT_READ}
    for space in ("default", "megatron", "deepspeed", "fsdp"):
        for name, value in load_space(space).knobs.items():
            if name in every:
                every[name].update(value if isinstance(value, (list, tuple)) else [value])
    for name, values in _EXTRA.items():
        every[name].update(values)
    varied: Counter[str] = Counter()
    for model, plans in _plans():
        for plan in plans:
            for numerics in (MIXED_BF16, FP32):
                states = {r: _fresh(model, plan, numerics, r) for r in ranks_to_check(model, plan)}
                for name, values in every.items():
                    if name == "micro_batch":  # keyed as num_microbatches
                        continue
                    for value in values:
                        try:
                            other = plan.replace(**{**_WITH.get(name, {}), name: value})
                        except (ConfigError, ValueError):
                            continue  # not a legal plan
                        if other == plan:
                            continue
                        for rank, kept in states.items():
                            assert _fresh(model, other, numerics, rank) == kept, (name, value, plan)
                        varied[name] += 1
    assert set(varied) == set(every) - {"micro_batch"}  # each field was really varied
    assert min(varied.values()) >= 20, varied


def test_a_plan_that_differs_in_a_read_field_is_not_served_anothers_states():
    model, cluster = load_model("70b"), make_cluster(num_gpus=16, gpu="a100-40gb")
    plan = ParallelPlan(
        tp=2, pp=2, dp=4, global_batch=64, seq_len=4096, sharding="zero1", framework="megatron"
    )
    kept = stage_states(model, plan, MIXED_BF16, rank=0)
    for other in (plan.replace(sharding="none"), plan.replace(tp=4, dp=2), plan.replace(offload=True)):
        assert stage_states(model, other, MIXED_BF16, rank=0) != kept
        assert stage_states(model, other, MIXED_BF16, rank=0) == _fresh(model, other, MIXED_BF16, 0)
    assert stage_states(model, plan, MIXED_BF16, rank=0) == kept == _fresh(model, plan, MIXED_BF16, 0)
    assert (
        stage_states(model, plan.replace(micro_batch=2), MIXED_BF16, rank=0) == kept
    )  # 8 -> 4 micro-batches
    assert cluster.num_gpus == plan.world_size
