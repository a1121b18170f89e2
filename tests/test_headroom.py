"""The search never recommends a plan above the memory headroom (autotune/headroom.py)."""

import pytest

from autotune.catalog import load_model, make_cluster
from autotune.cli._args import default_seq_len
from autotune.errors import ConfigError
from autotune.headroom import DEFAULT_MEMORY_HEADROOM, headroom_reason
from autotune.ranking import plan_search, rank_plans
from autotune.space import load_space, resolve_choices

SPACES = ("default", "fsdp", "deepspeed", "megatron")


@pytest.mark.slow
@pytest.mark.parametrize("space", SPACES)
@pytest.mark.parametrize(("model", "gpus", "gpu"), [("13b", 64, "h100-sxm"), ("70b", 16, "a100-80gb")])
def test_every_bundled_space_recommends_within_the_headroom(space, model, gpus, gpu):
    """Either a recommendation within the headroom, or no recommendation and the headroom named as why
    (70B on 16 A100s with the Megatron space: its best plan needs 99 % of the GPU)."""
    spec, cluster = load_model(model), make_cluster(gpu=gpu, num_gpus=gpus)
    try:
        ranking = plan_search(
            load_space(space), spec, cluster, pins={}, global_batch=None, seq_len=default_seq_len(spec)
        )
    except ConfigError as e:
        assert "above the memory headroom" in str(e)
        return
    budget = (1 - DEFAULT_MEMORY_HEADROOM) * cluster.gpu.memory_bytes
    assert ranking.feasible and all(e.memory_bytes_per_gpu <= budget for e in ranking.feasible)


def test_headroom_turns_a_tight_plan_away_and_says_why():
    spec, cluster = load_model("13b"), make_cluster(num_gpus=8)
    space = load_space("fsdp")
    pins = {"tp": 1, "pp": 1, "sharding": "fsdp-full", "recompute": "none", "micro_batch": 1}
    ranking = plan_search(space, spec, cluster, pins=pins, global_batch=64, seq_len=4096, memory_headroom=0.0)
    tight = max(ranking.feasible, key=lambda e: e.memory_bytes_per_gpu)
    share = tight.memory_bytes_per_gpu / tight.memory_capacity_bytes
    assert headroom_reason(tight, 0.0) is None
    reason = headroom_reason(tight, 1 - share + 0.01)
    assert reason and reason.startswith("above the memory headroom")
    ctx = ranking.ctx.__class__(
        **{
            **{f: getattr(ranking.ctx, f) for f in ranking.ctx.__dataclass_fields__},
            "memory_headroom": 1 - share + 0.01,
        }
    )
    again = rank_plans(resolve_choices(space, spec, cluster, pins), ctx)
    assert tight.plan not in [e.plan for e in again.feasible]
    assert "above the memory headroom" in again.pruned
