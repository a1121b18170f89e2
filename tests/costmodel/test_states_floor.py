"""``states_floor_bytes`` never exceeds the memory it bounds, on every kind of plan the spaces hold."""

from __future__ import annotations

import pytest

from autotune.catalog import load_model, make_cluster
from autotune.costmodel import memory_breakdown
from autotune.costmodel.stagestates import states_floor_bytes
from autotune.space import PlanContext, enumerate_plans, load_space, resolve_choices

# Knobs the model states do not depend on, pinned in the MoE spaces to keep their enumeration to seconds.
_TIME_KNOBS = {
    "recompute": "none",
    "async_tp": False,
    "tp_comm_overlap": False,
    "cp_comm": "p2p",
    "moe_dispatcher": "alltoall",
    "moe_a2a_overlap": False,
}


@pytest.mark.slow  # ~10 s: four spaces enumerated
@pytest.mark.parametrize(
    ("model", "gpus", "gpu", "pins"),
    [
        ("70b", 16, "a100-40gb", {}),  # dense: ZeRO/FSDP stages, offload, pipelines
        ("llama3-405b", 64, "h100-sxm", {"precision": "fp8"}),  # fp8; 126 layers: uneven pipeline stages
        ("mixtral-8x7b", 16, "h100-sxm", _TIME_KNOBS),  # experts over EP, the expert-data-parallel group
        ("deepseek-v3", 32, "h100-sxm", _TIME_KNOBS),  # MLA, dense first layers, multi-token prediction
    ],
)
def test_the_floor_is_below_every_plans_total(model, gpus, gpu, pins):
    spec, cluster = load_model(model), make_cluster(num_gpus=gpus, gpu=gpu)
    choices = resolve_choices(load_space(), spec, cluster, pins)
    ctx = PlanContext(model=spec, cluster=cluster, global_batch=4 * gpus, seq_len=4096)
    checked = 0
    for i, ladder in enumerate(enumerate_plans(choices, ctx)):
        if i % 7:  # every seventh ladder: all knobs still vary, in seconds
            continue
        for micro_batch in ladder.micro_batches[:2]:
            plan = ladder.plan(micro_batch)
            floor = states_floor_bytes(spec, cluster, plan)
            memory = memory_breakdown(spec, cluster, plan)
            assert 0 < floor <= memory.total_bytes * (1 + 1e-12), plan
            checked += 1
    assert checked > 200
