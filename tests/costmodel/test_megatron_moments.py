"""Megatron's precision-aware optimizer with bf16 Adam moments (``--adam-dtype bf16
--precision-aware-optimizer``: ``--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``), as Megatron-LM's MoE recipes
and the MoE model zoo run it: 2 B of fp32-master remainder + 2 x 2 B of moments per parameter."""

from __future__ import annotations

import dataclasses
import json

import pytest

from autotune.catalog import load_model, make_cluster
from autotune.costmodel.estimate import estimate
from autotune.costmodel.stagestates import stage_states
from autotune.costmodel.states import MIXED_BF16, megatron_optimizer_bytes
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
    """On every pipeline rank (the estimate reports the fullest, which the smaller moments can move: the
    first stage's 3 dense blocks make it lighter than the all-MoE middle ones)."""
    model, cluster = load_model("deepseek-v3"), make_cluster(num_gpus=256)
    ten_plan, six_plan = (_plan(precision_aware_optimizer=True, **kw) for kw in ({}, {"adam_dtype": "bf16"}))
    for rank in range(ten_plan.pp):
        ten, six = (stage_states(model, p, MIXED_BF16, rank=rank)[2] for p in (ten_plan, six_plan))
        assert six.optimizer_bytes == pytest.approx(0.6 * ten.optimizer_bytes), rank
        assert six.weights_bytes == ten.weights_bytes and six.gradients_bytes == ten.gradients_bytes
    ten_total, six_total = (estimate(model, cluster, p).memory.total_bytes for p in (ten_plan, six_plan))
    assert six_total < ten_total


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


def test_a_search_runs_the_users_megatron_optimizer_on_every_plan():
    """``search --precision-aware-optimizer --adam-dtype bf16``: the user's numerics, never tuned, so every
    plan carries them and only Megatron plans with its distributed optimizer are left, each priced at 6 B of
    optimizer state per parameter (a search that dropped them would price Megatron's fp32 state)."""
    from autotune.ranking import plan_search
    from autotune.space import load_space

    model, cluster = load_model("qwen3-30b-a3b"), make_cluster(num_gpus=32)
    stored = {"adam_dtype": "bf16", "precision_aware_optimizer": True, "grad_reduce_dtype": "bf16"}
    kw = dict(pins={"pp": 1, "tp": 1}, global_batch=256, seq_len=4096)
    ranking = plan_search(load_space(), model, cluster, stored=stored, **kw)
    plans = [r.plan for r in ranking.feasible]
    assert plans and all(str(p.framework) == "megatron" and p.precision_aware_optimizer for p in plans)
    assert all((str(p.adam_dtype), str(p.grad_reduce_dtype)) == ("bf16", "bf16") for p in plans)
    assert all(str(p.sharding) in ("zero1", "fsdp-full") or p.dp * p.cp == 1 for p in plans)
    assert ranking.pruned["the precision-aware optimizer and the gradient-reduce dtype are Megatron's"] > 0
    assert ranking.pruned["the precision-aware optimizer needs Megatron's distributed optimizer"] > 0
    best = plans[0]
    fp32 = estimate(model, cluster, best.replace(precision_aware_optimizer=False, adam_dtype=None)).memory
    assert estimate(model, cluster, best).memory.optimizer_bytes == pytest.approx(0.5 * fp32.optimizer_bytes)


def test_the_search_flags_reach_the_emitted_megatron_args_and_refuse_a_backend_without_megatron(
    tmp_path, capsys
):
    from autotune.cli import main

    args = ["search", "--model", "qwen3-30b-a3b", "--gpus", "16", "--pp", "1", "--global-batch", "128"]
    flags = ["--precision-aware-optimizer", "--adam-dtype", "bf16"]
    assert main([*args, *flags, "--backend", "simulate", "--out", str(tmp_path), "--quiet"]) == 0
    (text,) = [p.read_text() for p in tmp_path.glob("*/best/megatron_args.txt")]
    parsed, _ = megatron_parser().parse_known_args(text.split())
    assert parsed.use_precision_aware_optimizer and parsed.exp_avg_dtype == "bf16"
    assert "pa-optimizer" in capsys.readouterr().out
    torchrun = ["--backend", "torchrun", "--device", "cpu", "--model", "tiny", "--gpus", "2"]
    assert main(["search", "--precision-aware-optimizer", *torchrun, "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert "--precision-aware-optimizer: Megatron's optimizer, and --backend torchrun runs no Megatron" in err


def test_a_study_keeps_the_megatron_optimizer_in_its_identity_and_reads_it_back():
    """``stored_json`` (a study's identity, a worker's setup) round-trips through ``stored_fields``; a study
    made without the options keeps the three keys it had before them."""
    from autotune.space import PlanContext, stored_fields

    model, cluster = load_model("llama3-8b"), make_cluster(num_gpus=8)
    base = PlanContext(model=model, cluster=cluster, global_batch=64, seq_len=4096)
    assert set(base.stored_json()) == {"weight_dtype", "adam_dtype", "loss_kernel"}
    chosen = {"adam_dtype": "bf16", "precision_aware_optimizer": True, "grad_reduce_dtype": "bf16"}
    ctx = dataclasses.replace(base, **stored_fields(chosen))
    again = stored_fields(json.loads(json.dumps(ctx.stored_json())))
    assert again == ctx.stored() and ctx.megatron_optimizer and not base.megatron_optimizer
