"""Uneven pipeline splits as Megatron, torchtitan and DeepSpeed make them (autotune/stagesplit.py)."""

import pytest

from autotune.catalog import load_model, make_cluster
from autotune.costmodel.estimate import estimate
from autotune.emit.megatron import megatron_args_text
from autotune.emit.torchtitan import to_torchtitan_config
from autotune.errors import ConfigError
from autotune.plan import ParallelPlan, check_plan
from autotune.stagesplit import megatron_layout, split_layers


def _plan(**kw):
    base = {"global_batch": 2048, "seq_len": 8192, "tp": 8, "sharding": "zero1", "framework": "megatron"}
    return ParallelPlan(**{**base, **kw})


def test_megatron_405b_splits_as_its_recipes_do():
    """126 layers + embedding + loss = 128 = 16 x 8 = 8 x 8 x 2 (Megatron-Bridge's 405B recipe flags)."""
    pp16 = split_layers(126, _plan(pp=16, dp=8))
    assert (pp16.method, pp16.first_rank_layers, pp16.max_middle_layers, pp16.last_rank_layers) == (
        "account-embedding-and-loss",
        7,
        8,
        7,
    )
    vp8 = split_layers(126, _plan(pp=8, dp=16, schedule="interleaved", virtual_stages=8))
    assert len(vp8.chunk_layers) == 64 and sum(vp8.chunk_layers) == 126
    ends = (vp8.chunk_layers[0], vp8.chunk_layers[-1], vp8.rank_layers(0), vp8.rank_layers(3))
    assert ends == (1, 1, 15, 16)


def test_megatron_first_last_split_and_its_flags():
    split = split_layers(32, _plan(pp=5, dp=1, tp=1, sharding="none"))
    assert split.method == "first-last" and sum(split.chunk_layers) == 32
    assert all(split.rank_layers(r) == split.chunk_layers[1] for r in range(1, 4))
    text = megatron_args_text(_plan(pp=5, dp=1, tp=1, sharding="none"), load_model("llama3-8b"))
    assert f"--decoder-first-pipeline-num-layers {split.first_rank_layers}\n" in text
    assert f"--decoder-last-pipeline-num-layers {split.last_rank_layers}\n" in text


def test_torchtitan_and_deepspeed_splits_follow_their_source():
    titan = split_layers(126, _plan(pp=16, dp=8, framework="fsdp", sharding="fsdp-full"))
    assert titan.chunk_layers == (7,) + (8,) * 14 + (7,)  # generate_llm_fqn_per_model_part, weights 1 and 1
    cfg = to_torchtitan_config(
        _plan(pp=16, dp=8, framework="fsdp", sharding="fsdp-full"), load_model("llama3-405b")
    )["parallelism"]
    fqns = cfg["module_fqns_per_model_part"]
    assert fqns[0][:2] == ["tok_embeddings", "layers.0"] and fqns[-1][-2:] == ["norm", "output"]
    assert sum(len(p) for p in fqns) == 126 + 3
    ds = split_layers(126, _plan(pp=16, dp=8, tp=1, framework="deepspeed", sharding="zero1"))
    assert ds.chunk_layers == (7,) + (8,) * 14 + (7,)  # partition_uniform over embedding, blocks, head
    ds5 = split_layers(32, _plan(pp=5, dp=1, tp=1, framework="deepspeed", sharding="none"))
    assert ds5.chunk_layers == (6, 7, 7, 7, 5)  # 34 items: 7, 7, 7, 7, 6, less the embedding and the head


@pytest.mark.parametrize(
    "extra", [{"pp": 16, "dp": 128}, {"pp": 8, "dp": 256, "schedule": "interleaved", "virtual_stages": 8}]
)
def test_405b_expert_layouts_are_legal_and_estimated(extra):
    model, cluster = load_model("llama3-405b"), make_cluster(num_gpus=16384)
    plan = _plan(**extra)
    assert check_plan(plan, model, cluster) == []
    est = estimate(model, cluster, plan)
    assert est.step_time_s > 0 and est.memory_bytes_per_gpu > 0


def test_memory_takes_the_worst_stage_of_an_uneven_split():
    """PP16 x 126 layers: rank 1 holds 8 blocks and 15 micro-batches, more than rank 0's 7 x 16."""
    model, cluster = load_model("llama3-405b"), make_cluster(num_gpus=16384)
    from autotune.costmodel.memory import memory_breakdown, stage_memory

    plan = _plan(pp=16, dp=128, recompute="full", sequence_parallel=True)
    ranks = [stage_memory(model, cluster, plan, rank=r) for r in range(16)]
    assert memory_breakdown(model, cluster, plan).total_bytes == max(m.total_bytes for m in ranks)


def test_megatron_layout_splits_deepseek_v3():
    """61 layers at PP 8 x VP 2: neither account-for nor first/last fits; a --pipeline-model-parallel-layout
    does (Megatron-Bridge's DeepSeek-V3 recipes); the busiest rank holds 8 blocks, like the recipe's."""
    plan = _plan(pp=8, dp=32, tp=1, schedule="interleaved", virtual_stages=2)
    split = split_layers(61, plan)
    assert split.method == "layout" and sum(split.chunk_layers) == 61 and len(split.chunk_layers) == 16
    assert max(split.rank_layers(r) for r in range(8)) == 8
    assert megatron_layout(split).startswith("Ett|tttt|") and megatron_layout(split).endswith("|tttL")


def test_recompute_layers_prices_and_emits_megatrons_block_recompute():
    """Megatron-Bridge's Llama-3-8B H100 fp8 recipe (recompute_num_layers=5, CP 1) ran on 80 GB."""
    model, cluster = load_model("llama3-8b"), make_cluster(num_gpus=8)
    base = dict(
        tp=1, dp=8, global_batch=128, seq_len=8192, sharding="zero1", framework="megatron", precision="fp8"
    )
    none, all_layers = ParallelPlan(**base), ParallelPlan(**base, recompute="full")
    five = ParallelPlan(**base, recompute="full", recompute_layers=5)
    mem = [estimate(model, cluster, p).memory.activations_bytes for p in (none, five, all_layers)]
    assert mem[0] > mem[1] > mem[2]
    # the recipe's 5 layers fit even the reserved peak; with none the reserved peak passes the device (its
    # allocated peak, 98 %, is what estimate judges: not out of memory, but beyond the search's headroom)
    cap = cluster.gpu.memory_bytes
    reserved = [estimate(model, cluster, p).memory_bytes_per_gpu for p in (five, none)]
    assert reserved[0] < cap < reserved[1]
    text = megatron_args_text(five, model)
    assert "--recompute-method block\n" in text and "--recompute-num-layers 5\n" in text
    with pytest.raises(ConfigError, match="recompute-layers needs"):
        ParallelPlan(
            **{**base, "framework": "fsdp", "sharding": "fsdp-full"}, recompute="full", recompute_layers=5
        )


def test_megatron_places_the_mtp_module_in_the_last_chunk_before_the_loss():
    """DeepSeek-V3 with its MTP module: the recipes' layouts, ``Et*4|(t*4|)*14tmL`` at 16 chunks
    (Megatron-Bridge GB200/GB300, NVIDIA's MLPerf v6.0) and ``Et|(tt|)*30mL`` at 32 (Megatron-Bridge H100),
    which megatron-core's ``PipelineParallelLayerLayout`` accepts."""
    core = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout")
    for pp, v, expected in (
        (4, 4, "Et*4|(t*4|)*14tmL"),
        (8, 2, "Et*4|(t*4|)*14tmL"),
        (8, 4, "Et|(tt|)*30mL"),
    ):
        plan = _plan(pp=pp, dp=256 // pp, tp=1, schedule="interleaved", virtual_stages=v)
        layout = megatron_layout(split_layers(61, plan, mtp=1))
        parsed = core.PipelineParallelLayerLayout(layout, pp)
        assert parsed.layout == core.PipelineParallelLayerLayout(expected, pp).layout
        parsed.validate_layer_layout(num_layers=61, mtp_num_layers=1)
        with pytest.raises(AssertionError):
            parsed.validate_layer_layout(num_layers=61, mtp_num_layers=2)


def test_every_mtp_layout_autotune_writes_is_one_megatron_core_accepts():
    """Every PP x VP that the MTP layout can split 61 layers into: the chunks sum to the layers, none is
    negative, and megatron-core's layout check passes; a split that cannot is refused with the reason."""
    core = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout")
    for pp in (2, 4, 8, 16, 32):
        for v in (1, 2, 3, 4, 8):
            plan = _plan(pp=pp, dp=2, tp=1, schedule="interleaved" if v > 1 else "1f1b", virtual_stages=v)
            try:
                split = split_layers(61, plan, mtp=1)
            except ValueError as e:
                assert "MTP" in str(e) or "Megatron cannot split" in str(e)
                continue
            assert sum(split.chunk_layers) == 61 and min(split.chunk_layers) >= 0
            if split.method == "layout":
                layout = core.PipelineParallelLayerLayout(megatron_layout(split), pp)
                layout.validate_layer_layout(num_layers=61, mtp_num_layers=1)
