"""ParallelPlan owns its invariants; check_plan reports model/cluster rules as reasons."""

import pytest

from autotune.catalog import load_model, make_cluster
from autotune.errors import ConfigError
from autotune.plan import ParallelPlan, Sharding, check_plan


def _plan(**kw):
    base = {"global_batch": 64, "seq_len": 4096}
    return ParallelPlan(**{**base, **kw})


def test_round_trip_and_derived_values():
    plan = _plan(tp=8, dp=2, micro_batch=2, sharding="fsdp-full")
    assert plan.sharding is Sharding.FSDP_FULL
    assert (plan.world_size, plan.num_microbatches, plan.zero_stage) == (16, 16, 3)
    assert ParallelPlan.from_dict(plan.to_dict()) == plan


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dp": 3}, "global batch 64 is not divisible by DP x micro-batch = 3 x 1"),
        ({"sequence_parallel": True}, "sequence parallel needs TP > 1"),
        ({"pp": 4, "dp": 1, "micro_batch": 32}, "1f1b needs micro-batches per step >= PP: 2 < 4"),
        ({"pp": 2, "virtual_stages": 2}, "need --schedule interleaved"),
        ({"dp": 4, "sharding": "hsdp", "hsdp_shard_size": 3}, "hsdp needs a shard-group size"),
        ({"dp": 2, "sharding": "zero3", "framework": "fsdp"}, "framework fsdp does not offer sharding zero3"),
        ({"dp": 2, "pp": 2, "sharding": "zero2", "framework": "deepspeed"}, "rejects ZeRO-2/3"),
        ({"tp": 2, "pp": 2, "framework": "deepspeed"}, "AutoTP"),
        ({"offload": True}, "offload needs a sharded optimizer"),
        ({"cp": 3, "seq_len": 4096}, "2 x CP"),
        ({"sharding": "zero9"}, "sharding must be one of"),
    ],
)
def test_plan_rules_raise_one_line(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        _plan(**kwargs)


def test_check_plan_reports_model_and_cluster_rules():
    model = load_model("70b")  # 64 heads, 8 KV heads, 80 layers
    cluster = make_cluster(num_gpus=16)
    assert check_plan(_plan(tp=8, dp=2), model, cluster) == []
    reasons = check_plan(_plan(tp=16, dp=1), model, cluster)
    assert any(r.startswith("TP 16 does not divide KV heads 8") for r in reasons)
    uneven = check_plan(_plan(tp=8, pp=3, dp=1), model, make_cluster(num_gpus=24))  # torchtitan cuts 80 / 3
    assert not any("split" in r for r in uneven)
    two_by_three = _plan(tp=8, pp=2, dp=1, schedule="interleaved", virtual_stages=3, framework="megatron")
    assert not any("split" in r for r in check_plan(two_by_three, model, make_cluster(num_gpus=16)))  # layout
    too_many = two_by_three.replace(virtual_stages=42, global_batch=84)  # 84 chunks > 80 layers + 2
    reasons = check_plan(too_many, model, make_cluster(num_gpus=16))
    assert any("Megatron cannot split 80 layers" in r for r in reasons)
    assert any("equal the 16 GPUs" in r for r in check_plan(_plan(tp=8), model, cluster))
    assert any(
        "no fp8" in r
        for r in check_plan(
            _plan(tp=8, dp=2, precision="fp8"), model, make_cluster(num_gpus=16, gpu="a100-80gb")
        )
    )


def test_from_dict_rejects_unknown_and_wrong_types():
    with pytest.raises(ConfigError, match="unknown plan field 'tensor_parallel'"):
        ParallelPlan.from_dict({"tensor_parallel": 2, "global_batch": 8, "seq_len": 128})
    with pytest.raises(ConfigError, match="tp must be a positive integer"):
        ParallelPlan.from_dict({"tp": "2", "global_batch": 8, "seq_len": 128})
    with pytest.raises(ConfigError, match="missing plan field 'seq_len'"):
        ParallelPlan.from_dict({"global_batch": 8})


@pytest.mark.parametrize(("framework", "sharding"), [("megatron", "zero1"), ("fsdp", "fsdp-full")])
def test_sharding_spans_cp_at_dp_one(framework, sharding):
    """Megatron's distributed optimizer (``intra_dp_cp_group``) and torchtitan's FSDP over ``dp_shard_cp``
    (its Dec 2024 benchmark: "FSDP 1, CP 8") split states over DP x CP. Was: only Megatron, so torchtitan's
    published FSDP 1 x CP 8 layouts could not be priced. (DeepSpeed plans have no CP here.)"""
    plan = ParallelPlan(tp=1, cp=8, global_batch=8, seq_len=131072, sharding=sharding, framework=framework)
    assert plan.dp == 1 and plan.zero_stage >= 1
    with pytest.raises(ConfigError, match="needs DP > 1"):
        ParallelPlan(cp=1, global_batch=8, seq_len=131072, sharding=sharding, framework=framework)


def test_deepspeed_context_parallelism_is_ulysses():
    """DeepSpeed's CP is DeepSpeed-Ulysses (``DistributedAttention``): all-to-all only, no pipeline engine,
    no AutoTP beside it; ZeRO shards over DP x CP (``seq_data_parallel_group``)."""
    plan = ParallelPlan(
        cp=4, dp=2, global_batch=8, seq_len=32768, sharding="zero3", framework="deepspeed", cp_comm="a2a"
    )
    assert plan.world_size == 8
    for changes, message in (
        ({"cp_comm": "p2p"}, "use --cp-comm a2a"),
        ({"tp": 2}, "use TP=1 with CP > 1"),
        ({"pp": 2, "sharding": "zero1"}, "use PP=1 with CP > 1"),
    ):
        with pytest.raises(ConfigError, match=message):
            plan.replace(**changes)
    with pytest.raises(ConfigError, match="needs --framework megatron or deepspeed"):
        plan.replace(framework="fsdp", sharding="fsdp-full")


def test_the_sequence_split_over_tp_is_checked_as_torchtitan_and_megatron_check_it():
    """torchtitan asserts that TP x 2 CP divides seq_len whenever TP > 1 (``ParallelDims.seq_len_divisor``,
    asked here); Megatron's sequence parallelism splits a CP rank's ``seq_len / cp`` tokens over TP, which
    megatron-core's ``_split_along_first_dim`` asserts divide. 4104 = 8 x 513: 2 x CP and TP x CP divide it,
    TP x 2 CP does not; 4100: 2 x CP does, TP x CP does not."""
    from torchtitan.distributed.parallel_dims import ParallelDims

    divisor = ParallelDims(dp_replicate=1, dp_shard=2, cp=2, tp=4, pp=1, ep=1, etp=1, world_size=16)
    layout = {"tp": 4, "cp": 2, "dp": 2, "sequence_parallel": True}
    assert (divisor.seq_len_divisor, 4096 % divisor.seq_len_divisor, 4104 % divisor.seq_len_divisor) == (
        16,
        0,
        8,
    )
    assert _plan(**layout, framework="fsdp").seq_len == 4096
    with pytest.raises(ConfigError, match="seq-len 4104 is not divisible by TP x CP x 2 = 16"):
        _plan(**layout, framework="fsdp", seq_len=4104)
    assert _plan(**layout, framework="megatron", seq_len=4104).tp == 4
    with pytest.raises(
        ConfigError, match="seq-len 4100 is not divisible by TP x CP = 8: it is split over TP"
    ):
        _plan(**layout, framework="megatron", seq_len=4100)
    assert not _plan(
        **{**layout, "sequence_parallel": False}, framework="megatron", seq_len=4100
    ).sequence_parallel


def test_mxfp8_needs_blackwell_as_torchao_and_transformer_engine_assert():
    """MXFP8's block scales run on Blackwell's tensor cores only (torchtitan's MX converter: "MXFP8 is only
    supported on CUDA SM100 or later"); on a Hopper the plan is refused with the GPU's capability, on a B200
    it is legal, and the search space prunes it the same way."""
    from autotune.ranking import plan_search
    from autotune.space import SearchSpace, load_space

    model, plan = load_model("llama3-8b"), _plan(dp=8, sharding="fsdp-full", precision="fp8", fp8_recipe="mx")
    reasons = check_plan(plan, model, make_cluster(num_gpus=8, gpu="h100-sxm"))
    assert reasons == ["fp8-recipe mx (MXFP8) needs Blackwell, compute capability 10.0+; h100-sxm is 9.0"]
    assert check_plan(plan, model, make_cluster(num_gpus=8, gpu="b200")) == []
    knobs = {**load_space("fsdp").knobs, "precision": ("fp8",), "fp8_recipe": ("tensorwise", "mx")}
    space, pins = SearchSpace(knobs=knobs, source="test"), {"tp": 1, "pp": 1, "cp": 1}
    hopper = plan_search(space, model, make_cluster(num_gpus=8), pins=pins, global_batch=64, seq_len=4096)
    assert {str(e.plan.fp8_recipe) for e in hopper.feasible} == {"tensorwise"}
    assert hopper.pruned["MXFP8 needs Blackwell (compute capability 10.0+)"] > 0
