"""`autotune explain`: what binds, and one-knob neighbours that are legal, feasible and ranked by effect."""

import json

import pytest

from autotune.catalog import load_model, make_cluster
from autotune.cli import main
from autotune.explain import explain, neighbours
from autotune.plan import ParallelPlan, check_plan

_COUPLED = {"dp", "schedule", "virtual_stages", "sequence_parallel"}
"""Knobs that follow a TP/PP/virtual-stage change (DP takes the rest of the GPUs, ...)."""


def _plan(**kw):
    base = {"global_batch": 512, "seq_len": 4096}
    return ParallelPlan(**{**base, **kw})


def test_a_feasible_plan_gets_feasible_changes_ranked_by_tokens_per_s():
    model, cluster = load_model("7b"), make_cluster(num_gpus=8)
    plan = _plan(dp=8, sharding="zero1", framework="deepspeed", recompute="full")  # needless recompute
    result = explain(model, cluster, plan)
    assert result.estimate.feasible and result.binds.startswith("compute")
    gains = [s.tokens_per_s_gain for s in result.suggestions]
    assert gains and gains == sorted(gains, reverse=True) and gains[0] > 0.1
    assert all(s.estimate.feasible for s in result.suggestions)
    assert result.suggestions[0].change.startswith("recompute full -> ")


def test_a_plan_bound_by_the_token_exchange_gets_the_dispatcher_and_the_ep_overlap():
    """Qwen3-235B on 256 H100 with EP across 4 nodes: the exchange binds; DeepEP and the EP overlap help."""
    model, cluster = load_model("qwen3-235b-a22b"), make_cluster(num_gpus=256)
    plan = _plan(
        tp=2,
        pp=8,
        dp=16,
        ep=32,
        global_batch=2048,
        schedule="interleaved",
        virtual_stages=4,
        framework="megatron",
        sharding="zero1",
        sequence_parallel=True,
        recompute="selective",
    )
    result = explain(model, cluster, plan)
    assert result.binds.startswith("EP all-to-all")
    changes = {s.change: s.tokens_per_s_gain for s in result.suggestions}
    assert changes["MoE dispatcher alltoall -> deepep"] > 0.1 and changes["EP all-to-all overlap on"] > 0.1


def test_an_oom_plan_gets_the_changes_that_free_the_most_memory_feasible_first():
    model, cluster = load_model("70b"), make_cluster(num_gpus=16)
    plan = _plan(tp=8, dp=2, sharding="fsdp-full")
    result = explain(model, cluster, plan)
    assert not result.estimate.feasible and result.binds.startswith("memory: needs")
    first = result.suggestions[0]
    assert first.estimate.feasible and first.memory_freed_bytes > 0
    feasible = [s.estimate.feasible for s in result.suggestions]
    assert feasible == sorted(feasible, reverse=True)


@pytest.mark.parametrize(
    "plan",
    [
        _plan(tp=2, pp=2, dp=4, sharding="fsdp-full", sequence_parallel=True),
        _plan(
            tp=1, pp=4, dp=4, schedule="interleaved", virtual_stages=2, sharding="zero1", framework="megatron"
        ),
        _plan(tp=4, dp=4, sharding="zero2", framework="deepspeed", offload=True),
    ],
)
def test_neighbours_are_legal_and_change_one_knob(plan):
    model, cluster = load_model("7b"), make_cluster(num_gpus=16)
    found = list(neighbours(plan, model, cluster))
    assert len(found) >= 5
    for label, other in found:
        assert not check_plan(other, model, cluster), label
        changed = {k for k, v in other.to_dict().items() if plan.to_dict()[k] != v} - _COUPLED
        assert len(changed) <= 1, (label, changed)
        assert other != plan


@pytest.mark.slow
def test_cli_explains_the_plan_file_a_search_wrote(tmp_path, capsys):
    argv = ["search", "--model", "7b", "--gpus", "8", "--global-batch", "64", "--top", "1", "--quiet"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    plan_file = tmp_path / "7b-8xh100-sxm" / "best" / "plan.json"
    assert main(["explain", "--plan", str(plan_file)]) == 0
    out = capsys.readouterr().out
    assert "binds " in out and "step time" in out
    assert main(["explain", "--plan", str(plan_file), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"binds", "suggestions", "time_shares", "memory_shares_of_capacity", "num_neighbours"} <= set(data)
    assert sum(data["time_shares"].values()) == pytest.approx(1.0)


def test_cli_flags_like_estimate_and_bad_input(capsys):
    assert (
        main(
            [
                "explain",
                "--model",
                "70b",
                "--gpus",
                "16",
                "--tp",
                "8",
                "--sharding",
                "fsdp-full",
                "--global-batch",
                "512",
                "--seq-len",
                "4096",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "what would help most (memory freed" in out and "optimizer offload on" in out
    assert main(["explain", "--model", "7b", "--gpus", "8", "--tp", "3"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "autotune explain: error:" in err
    assert main(["explain"]) == 2
