"""Where a stage's routed experts live: the MoE blocks of each pipeline rank by their indices, and HSDP
replicas holding their own copy of the experts' states. ``tests/emit/test_emit_torchtitan_itself.py`` holds
both against the parameters torchtitan 0.2.2 leaves on a rank."""

import pytest

from autotune.catalog import load_model
from autotune.costmodel.stagestates import rank_layers, rank_moe_blocks, ranks_to_check, stage_states
from autotune.costmodel.states import MIXED_BF16
from autotune.modelshape import mlp_part_params, routed_expert_params
from autotune.plan import ParallelPlan


def _plan(**kw):
    return ParallelPlan(**{"global_batch": 1024, "seq_len": 4096, "sharding": "fsdp-full", **kw})


def test_deepseek_v3s_dense_first_blocks_sit_on_the_first_stage():
    """61 blocks, the first 3 dense: torchtitan's PP 4 split gives the first stage the embedding and 15
    blocks, 12 of them MoE; the middle stages hold MoE blocks only."""
    model, plan = load_model("deepseek-v3"), _plan(pp=4, dp=64, ep=16)
    assert rank_layers(model, plan) == (15.0, 16.0, 16.0, 14.0)
    assert rank_moe_blocks(model, plan) == (12, 16, 16, 14)
    zbv = _plan(pp=4, dp=64, ep=16, virtual_stages=2, schedule="zbv")  # rank 0: chunks 0 and 7
    assert rank_moe_blocks(model, zbv)[0] == rank_layers(model, zbv)[0] - 3
    assert rank_moe_blocks(model, _plan(dp=256, ep=16)) is None  # no PP: the model's share is exact
    qwen3, piped = load_model("qwen3-30b-a3b"), _plan(pp=4, dp=4, ep=4)
    assert rank_moe_blocks(qwen3, piped) == rank_layers(qwen3, piped)  # every block MoE


def test_a_stages_parameters_are_its_own_blocks():
    """Stage 0 of DeepSeek-V3 at PP 4: the mean block overstated it by 17 % (3 of its 15 blocks are dense),
    and understated the all-MoE middle stages."""
    model, plan = load_model("deepseek-v3"), _plan(pp=4, dp=64, ep=16)
    mean_block = model.params_per_layer - model.expert_params_per_layer  # the mixer + the MLP outside experts
    moe_mlp, dense_mlp = mlp_part_params(model, moe=True), mlp_part_params(model, moe=False)
    mixer = mean_block - (58 * (moe_mlp - routed_expert_params(model)) + 3 * dense_mlp) / 61
    routed = routed_expert_params(model) / 16
    exact = 15 * mixer + 3 * dense_mlp + 12 * (moe_mlp - routed_expert_params(model) + routed)
    exact += model.vocab_size * model.hidden_size  # the embedding
    assert stage_states(model, plan, MIXED_BF16, rank=0)[1] == pytest.approx(exact, rel=1e-9)
    middle = stage_states(model, plan, MIXED_BF16, rank=1)[1]
    assert middle == pytest.approx(16 * (mixer + moe_mlp - routed_expert_params(model) + routed), rel=1e-9)


def test_hsdp_replicas_hold_their_own_copy_of_the_experts():
    """torchtitan shards routed experts over ``efsdp`` = dp_shard x cp x tp / (ep x etp); the
    ``dp_replicate`` copies are not sharded (``parallel_dims.py``), as dense states are not."""
    model = load_model("qwen3-30b-a3b")
    full, hsdp = _plan(dp=16, ep=8), _plan(dp=16, ep=8, sharding="hsdp", hsdp_shard_size=8)
    assert (full.expert_shard_degree, hsdp.expert_shard_degree) == (2, 1)
    experts = len(model.moe_layers) * routed_expert_params(model) / 8
    dense = model.num_params - len(model.moe_layers) * routed_expert_params(model)
    for plan, shard, expert_shard in ((full, 16, 2), (hsdp, 8, 1)):
        weights = stage_states(model, plan, MIXED_BF16, rank=0)[2].weights_bytes
        assert weights == pytest.approx(4 * (dense / shard + experts / expert_shard), rel=1e-9)


def test_the_memory_check_takes_the_first_all_moe_stage_at_an_even_split():
    """GLM-4.5's 92 blocks split 4 x 23 by Megatron: the first stage's 3 dense blocks make it lighter than
    the next, which holds more micro-batches in flight than the last; so it is checked too."""
    model = load_model("glm-4.5")
    plan = _plan(pp=4, dp=16, ep=8, framework="megatron", sharding="zero1")
    assert rank_layers(model, plan) == (23.0,) * 4 and rank_moe_blocks(model, plan) == (20, 23, 23, 23)
    assert ranks_to_check(model, plan) == (0, 1, 3)
    first, second = (stage_states(model, plan, MIXED_BF16, rank=r)[1] for r in (0, 1))
    assert second > first
