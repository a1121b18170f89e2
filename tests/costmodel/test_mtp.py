"""Multi-token prediction modules (autotune.costmodel.mtp, ``ModelSpec.mtp_layers``)."""

import pytest

from autotune.catalog import load_model, make_cluster
from autotune.costmodel import flops
from autotune.costmodel.estimate import estimate
from autotune.legality import check_plan
from autotune.plan import ParallelPlan

DSV3 = load_model("deepseek-v3")  # the preset: main model only
DSV3_MTP = DSV3.__class__(**{**{f: getattr(DSV3, f) for f in DSV3.__dataclass_fields__}, "mtp_layers": 1})


def _plan(**kw):
    return ParallelPlan(
        **{
            "pp": 8,
            "dp": 32,
            "ep": 32,
            "global_batch": 2048,
            "seq_len": 4096,
            "framework": "megatron",
            "sharding": "zero1",
            "schedule": "interleaved",
            "virtual_stages": 2,
            "recompute": "full",
            **kw,
        }
    )


def test_flops_count_a_block_eh_proj_and_a_head_per_module_as_megatron_does():
    s, h = 4096, DSV3.hidden_size
    per_layer = flops.layer_gemm_flops_per_token(DSV3) + flops.attention_flops_per_token(DSV3, s)
    added = flops.model_flops_per_token(DSV3_MTP, s) - flops.model_flops_per_token(DSV3, s)
    assert added == pytest.approx(3 * (per_layer + 4 * h * h + flops.lm_head_flops_per_token(DSV3)))


def test_the_module_slows_and_fills_the_last_stage():
    cluster = make_cluster(num_gpus=256, gpu="h100-sxm")
    plain, mtp = estimate(DSV3, cluster, _plan()), estimate(DSV3_MTP, cluster, _plan())
    # the recipes' layout gives the module and the loss three blocks' place in the last chunk, which leaves
    # the last rank no busier than the others here: the step holds; without pipelining the module adds up
    assert plain.step_time_s <= mtp.step_time_s < 1.1 * plain.step_time_s
    flat = _plan(pp=1, dp=256, ep=64, schedule="1f1b", virtual_stages=1)
    flat_plain, flat_mtp = estimate(DSV3, cluster, flat), estimate(DSV3_MTP, cluster, flat)
    assert 1.01 * flat_plain.step_time_s < flat_mtp.step_time_s < 1.1 * flat_plain.step_time_s
    assert mtp.time.model_flops > plain.time.model_flops
    assert mtp.memory_bytes_per_gpu >= plain.memory_bytes_per_gpu


def test_only_megatron_plans_price_it():
    cluster = make_cluster(num_gpus=256, gpu="h100-sxm")
    plan = _plan(
        pp=1, dp=256, ep=64, framework="fsdp", sharding="fsdp-full", schedule="1f1b", virtual_stages=1
    )
    (error,) = check_plan(plan, DSV3_MTP, cluster)
    assert "--framework megatron" in error and "num_nextn_predict_layers" in error
    assert check_plan(plan, DSV3, cluster) == []
