"""The ranking over a known landscape (``tests/fakesearch.py``): no feasible plan lost, bad input named."""

import pytest
from fakesearch import fake_estimate, fake_ranking

from autotune.catalog import make_cluster
from autotune.errors import ConfigError
from autotune.headroom import headroom_reason
from autotune.plan import Framework
from autotune.ranking import rule_of
from autotune.space import load_space, resolve_choices


def test_rule_of_drops_the_numbers():
    assert rule_of("out of memory: needs 91.2 GiB per GPU but h100-sxm has 79.6 GiB") == "out of memory"
    assert rule_of("TP 16 does not divide KV heads 8") == "TP does not divide KV heads"


@pytest.mark.slow
def test_micro_batch_cutoff_loses_no_feasible_plan():
    ranking = fake_ranking()
    every = [fake_estimate(ranking.ctx.model, ranking.ctx.cluster, est.plan) for est in ranking.feasible]
    assert ranking.feasible and ranking.pruned.get("out of memory", 0) > 0
    brute = _brute_force_feasible(ranking)
    assert [e.plan for e in ranking.feasible] == [e.plan for e in brute] == [e.plan for e in every]
    above = ranking.pruned.get("above the memory headroom", 0)
    assert ranking.num_legal == len(brute) + ranking.pruned["out of memory"] + above


def _brute_force_feasible(ranking):
    from autotune.space import enumerate_plans

    choices = resolve_choices(load_space(), ranking.ctx.model, ranking.ctx.cluster)
    ests = [
        fake_estimate(ranking.ctx.model, ranking.ctx.cluster, ladder.plan(m))
        for ladder in enumerate_plans(choices, ranking.ctx)
        for m in ladder.micro_batches
    ]
    fits = (e for e in ests if e.feasible and headroom_reason(e, ranking.ctx.memory_headroom) is None)
    return sorted(fits, key=lambda e: e.tokens_per_s, reverse=True)


@pytest.mark.slow
def test_bad_input_names_the_fix():
    with pytest.raises(ConfigError, match=r"--global-batch 3: no DP x micro-batch .*\(DP can be 2\); try"):
        fake_ranking(model="70b", gpus=16, gb=3, pins={"tp": 8, "pp": 1, "cp": 1})
    with pytest.raises(ConfigError, match="no legal plan.*TP does not divide the KV heads"):
        fake_ranking(model="70b", gpus=16, pins={"tp": 16, "framework": "fsdp"})  # Megatron replicates them
    cluster_at = lambda n: make_cluster(num_gpus=n)  # noqa: E731
    with pytest.raises(ConfigError, match=r"70b fits nowhere on 2 h100-sxm.*fit on (\d+) GPUs: --gpus \1"):
        fake_ranking(model="70b", gpus=2, cluster_at=cluster_at)


def test_no_legal_plan_names_the_rule_of_the_model_not_the_arithmetic_of_the_space():
    """MiniMax-M2's MTP modules are priced for Megatron only: pinned to fsdp, nothing is legal, and the error
    says so first, not the global batch (some micro-batches divide it) nor the space's layout arithmetic."""
    with pytest.raises(ConfigError, match=r"no legal plan for minimax-m2 .*: [\d,]+ multi-token prediction"):
        fake_ranking(model="minimax-m2", gpus=64, gb=256, pins={"framework": "fsdp", "pp": 1, "cp": 1})


def test_a_backend_limits_the_frameworks():
    ranking = fake_ranking(frameworks={Framework.DEEPSPEED})
    assert ranking.choices["framework"] == ["deepspeed"]
    with pytest.raises(ConfigError, match="cannot be measured here"):
        fake_ranking(pins={"framework": "megatron"}, frameworks={Framework.DEEPSPEED})


def test_the_fits_nowhere_hint_makes_the_combinations_once(monkeypatch):
    """The hint ranks 2x, 4x ... the GPU count with the same knob choices: their non-layout combinations
    (``enumeration.Variants``, ~1M for an MoE space) are made once for the ranking and every count."""
    from autotune import enumeration
    from autotune.catalog import load_model
    from autotune.ranking import plan_search

    made: list[tuple[int, bool, int]] = []
    real = enumeration._variants
    monkeypatch.setattr(enumeration, "_variants", lambda c, *key: made.append(key) or real(c, *key))
    monkeypatch.setenv("AUTOTUNE_PLAN_WORKERS", "1")
    cluster_at = lambda n: make_cluster(num_gpus=n, gpu="a100-40gb")  # noqa: E731
    with pytest.raises(ConfigError, match=r"fits nowhere on 2 a100-40gb.*fit on (\d+) GPUs: --gpus \1"):
        plan_search(
            load_space(),
            load_model("70b"),
            cluster_at(2),
            pins={"precision": "bf16"},
            global_batch=None,
            seq_len=4096,
            cluster_at=cluster_at,
        )
    assert made and len(made) == len(set(made))  # each (TP, PP > 1, CP) once, over every count ranked
