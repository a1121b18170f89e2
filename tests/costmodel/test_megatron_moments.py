"""Megatron's precision-aware optimizer with bf16 Adam moments (``--adam-dtype bf16
--precision-aware-optimizer``: ``--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``), as Megatron-LM's MoE recipes
and the MoE model zoo run it: 2 B of fp32-master remainder + 2 x 2 B of moments per parameter."""

from __future__ import annotations

import pytest

from autotune.catalog import load_model, make_cluster
from autotune.costmodel.estimate import estimate
from autotune.costmodel.states import megatron_optimizer_bytes
from autotune.emit.megatron import megatron_args_text
from autotune.errors import ConfigError
from autotune.plan import ParallelPlan
from tests.emit.megatron_flags import megatron_parser


def _plan(**kw):
    base = dict(pp=8, dp=32, ep=32, global_batch=1024, seq_len=4096, framework="megatron", sharding="zero1")
    return ParallelPlan(**{**base, "recompute": "full", **kw})


def test_bf16_moments_take_six_bytes_with_the_remainders():
    assert megatron_optimizer_bytes(_plan()) == 12.0
    assert megatron_optimizer_bytes(_plan(precision_aware_optimizer=True)) == 10.0
    assert megatron_optimizer_bytes(_plan(precision_aware_optimizer=True, adam_dtype="bf16")) == 6.0


def test_deepseek_v3_on_256_h100_holds_three_fifths_of_the_optimizer_state():
    model, cluster = load_model("deepseek-v3"), make_cluster(num_gpus=256)
    ten, six = (
        estimate(model, cluster, _plan(precision_aware_optimizer=True, **kw)).memory
        for kw in ({}, {"adam_dtype": "bf16"})
    )
    assert six.optimizer_bytes == pytest.approx(0.6 * ten.optimizer_bytes)
    assert six.weights_bytes == ten.weights_bytes and six.gradients_bytes == ten.gradients_bytes


def test_the_flags_are_emitted_and_bf16_moments_need_the_precision_aware_optimizer():
    model = load_model("llama3-8b")
    plan = ParallelPlan(dp=8, global_batch=64, seq_len=4096, framework="megatron", sharding="zero1")
    text = megatron_args_text(plan.replace(precision_aware_optimizer=True, adam_dtype="bf16"), model)
    args, _ = megatron_parser().parse_known_args(text.split())
    assert args.use_precision_aware_optimizer and (args.exp_avg_dtype, args.exp_avg_sq_dtype) == (
        "bf16",
        "bf16",
    )
    assert "--exp-avg-dtype" not in megatron_args_text(plan.replace(precision_aware_optimizer=True), model)
    with pytest.raises(
        ConfigError, match="--adam-dtype bf16 needs --framework fsdp .* --precision-aware-optimizer"
    ):
        plan.replace(adam_dtype="bf16")
    with pytest.raises(ConfigError, match="--weight-dtype bf16 needs --framework fsdp"):
        plan.replace(precision_aware_optimizer=True, adam_dtype="bf16", weight_dtype="bf16")
