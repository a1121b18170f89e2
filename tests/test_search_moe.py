"""Searching an MoE model: expert parallelism is in the space, and a model too large for a cluster says so."""

import json

import pytest

from autotune.cli import main


@pytest.mark.slow  # every legal Megatron plan of a 671B MoE is estimated (~25 s on 2 cores)
def test_deepseek_v3_on_256_h100_gets_an_expert_parallel_plan(tmp_path):
    """Issue 23: on 256-1024 H100 the search returns an EP plan (at the range's cheapest end to rank), over
    the framework whose plan wins there (the whole default space, ~60 s more here, is timed at 512 GPUs by
    benchmarks/search_speed.py)."""
    assert (
        main(
            [
                "search",
                "--model",
                "deepseek-v3",
                "--gpus",
                "256",
                "--framework",
                "megatron",
                "--backend",
                "simulate",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    (plan_file,) = tmp_path.glob("*/best/plan.json")
    plan = json.loads(plan_file.read_text())["plan"]
    assert plan["ep"] > 1


@pytest.mark.slow  # every legal plan of a 671B MoE is estimated (~80 s on 2 cores)
def test_deepseek_v3_on_eight_a100_fits_nowhere(tmp_path, capsys):
    assert (
        main(
            [
                "search",
                "--model",
                "deepseek-v3",
                "--gpus",
                "8",
                "--gpu",
                "a100-40gb",
                "--backend",
                "simulate",
                "--out",
                str(tmp_path),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "fits nowhere" in err and "out of memory" in err


def test_real_trials_refuse_a_model_the_trial_workload_cannot_build(tmp_path, capsys):
    assert (
        main(
            [
                "search",
                "--model",
                "deepseek-v3",
                "--gpus",
                "2",
                "--gpu",
                "cpu",
                "--device",
                "cpu",
                "--backend",
                "torchrun",
                "--trials",
                "1",
                "--out",
                str(tmp_path),
            ]
        )
        == 2
    )
    assert "built-in trial model has no multi-head latent attention" in capsys.readouterr().err


def test_pinning_ep_on_a_dense_model_is_one_line(tmp_path, capsys):
    assert (
        main(
            [
                "search",
                "--model",
                "llama3-8b",
                "--gpus",
                "8",
                "--backend",
                "simulate",
                "--ep",
                "2",
                "--out",
                str(tmp_path),
            ]
        )
        == 2
    )
    assert "--ep 2: llama3-8b is a dense model" in capsys.readouterr().err


def test_a_capacity_factor_is_the_users_and_set_on_every_plan(tmp_path):
    """``--moe-capacity-factor`` is like the batch: every plan carries it, torchtitan's (dropless) are pruned
    with the reason, and the emitted Megatron flags drop and pad."""
    from autotune.catalog import load_model, make_cluster
    from autotune.ranking import plan_search
    from autotune.space import load_space

    model, cluster = load_model("qwen3-30b-a3b"), make_cluster(num_gpus=16)
    ranking = plan_search(
        load_space(),
        model,
        cluster,
        pins={"ep": 8},
        global_batch=64,
        seq_len=4096,
        routing={"moe_capacity_factor": 1.25},
    )
    assert ranking.feasible and {r.plan.moe_capacity_factor for r in ranking.feasible} == {1.25}
    assert {str(r.plan.framework) for r in ranking.feasible} <= {"megatron", "deepspeed"}
    assert "torchtitan's MoE has no capacity factor (dropless)" in ranking.pruned
    args = ["search", "--model", "qwen3-30b-a3b", "--gpus", "16", "--backend", "simulate"]
    args += ["--space", "megatron", "--pp", "1", "--cp", "1"]  # a small space: the flags are what is checked
    assert main([*args, "--moe-capacity-factor", "1.25", "--out", str(tmp_path)]) == 0
    (emitted,) = tmp_path.glob("*/best/megatron_args.txt")
    assert "--moe-expert-capacity-factor 1.25\n--moe-pad-expert-input-to-capacity" in emitted.read_text()


def test_a_capacity_factor_on_a_dense_model_or_real_built_in_trials_is_one_line(tmp_path, capsys):
    base = ["search", "--gpus", "8", "--moe-capacity-factor", "1.0", "--out", str(tmp_path)]
    assert main([*base, "--model", "llama3-8b", "--backend", "simulate"]) == 2
    assert "--moe-capacity-factor: llama3-8b is a dense model; drop the flag" in capsys.readouterr().err
    assert main([*base, "--model", "tiny-moe", "--backend", "torchrun", "--device", "cpu"]) == 2
    assert "the built-in trial MoE routes dropless" in capsys.readouterr().err


def test_a_measured_load_imbalance_slows_every_plan_and_makes_another_study(tmp_path):
    """``--moe-load-imbalance``: the busiest EP rank's experts take that many more routed copies, on every
    plan of the search; the study records it (a different run, a different study)."""
    from autotune.catalog import load_model, make_cluster
    from autotune.ranking import plan_search
    from autotune.space import load_space

    model, cluster = load_model("qwen3-30b-a3b"), make_cluster(num_gpus=16)

    def best(routing):
        ranking = plan_search(
            load_space("megatron"),
            model,
            cluster,
            pins={"ep": 8, "tp": 1, "pp": 1, "cp": 1},
            global_batch=64,
            seq_len=4096,
            routing=routing,
        )
        assert {r.plan.moe_load_imbalance for r in ranking.feasible} == {
            routing.get("moe_load_imbalance", 1.0)
        }
        return ranking.feasible[0].tokens_per_s

    assert best({"moe_load_imbalance": 1.5}) < 0.95 * best({})
    args = [
        "search",
        "--model",
        "qwen3-30b-a3b",
        "--gpus",
        "16",
        "--backend",
        "simulate",
        "--space",
        "megatron",
        "--pp",
        "1",
        "--cp",
        "1",
    ]  # a small space: the study's record of the imbalance is what is checked
    assert main([*args, "--moe-load-imbalance", "1.3", "--out", str(tmp_path)]) == 0
    (plan_file,) = tmp_path.glob("*/best/plan.json")
    assert json.loads(plan_file.read_text())["plan"]["moe_load_imbalance"] == 1.3


def test_the_search_weighs_megatrons_dispatchers_and_token_drop_keeps_the_all_to_all():
    """``moe_dispatcher`` is a speed knob of Megatron MoE plans with EP > 1 (search_spaces/megatron.yaml):
    across nodes DeepEP's one copy per node can win; a capacity factor needs the all-to-all."""
    from autotune.catalog import load_model, make_cluster
    from autotune.ranking import plan_search
    from autotune.space import load_space

    model, cluster = load_model("qwen3-235b-a22b"), make_cluster(num_gpus=128)
    pins = {"tp": 2, "pp": 4, "cp": 2, "ep": 16, "recompute": "full"}

    def ranked(routing):
        return plan_search(
            load_space("megatron"), model, cluster, pins=pins, global_batch=512, seq_len=4096, routing=routing
        )

    dispatchers = {str(r.plan.moe_dispatcher) for r in ranked({}).feasible}
    assert {"alltoall", "allgather", "deepep"} <= dispatchers
    dropped = ranked({"moe_capacity_factor": 1.0})
    assert {str(r.plan.moe_dispatcher) for r in dropped.feasible} == {"alltoall"}
    assert "Megatron's capacity factor needs the alltoall dispatcher" in dropped.pruned


def test_the_search_weighs_megatrons_ep_overlap_where_megatron_runs_it():
    """``moe_a2a_overlap`` is a speed knob of Megatron MoE plans with EP > 1: the overlapped plan of a
    layout is faster than the same plan without it; full recompute and 1F1B with PP > 1 prune it."""
    from autotune.catalog import load_model, make_cluster
    from autotune.ranking import plan_search
    from autotune.space import load_space

    model, cluster = load_model("qwen3-235b-a22b"), make_cluster(num_gpus=128)

    def ranked(**pins):
        return plan_search(
            load_space("megatron"),
            model,
            cluster,
            pins={"tp": 2, "pp": 4, "cp": 2, "ep": 16, **pins},
            global_batch=512,
            seq_len=4096,
        )

    feasible = ranked(recompute="selective").feasible
    by_plan = {e.plan: e for e in feasible}
    pairs = [(by_plan[e.plan.replace(moe_a2a_overlap=False)], e) for e in feasible if e.plan.moe_a2a_overlap]
    assert pairs and all(on.step_time_s < off.step_time_s for off, on in pairs)
    full = ranked(recompute="full")
    assert not any(r.plan.moe_a2a_overlap for r in full.feasible)
    assert "Megatron's EP overlap does not run with full recompute" in full.pruned


def test_pinning_the_ep_overlap_on_a_dense_model_is_one_line(tmp_path, capsys):
    argv = ["search", "--model", "llama3-8b", "--gpus", "8", "--moe-a2a-overlap", "--backend", "simulate"]
    assert main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--moe-a2a-overlap" in err and "dense model" in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())  # nothing written


def test_the_megatron_space_weighs_the_experts_activation_offload():
    """``offload_modules`` is a knob of Megatron MoE plans (megatron.yaml): its plans hold less than the same
    plan without it and never run faster; full recompute prunes it; a dense model never gets it."""
    from autotune.catalog import load_model, make_cluster
    from autotune.ranking import plan_search
    from autotune.space import load_space, resolve_choices

    model, cluster = load_model("qwen3-30b-a3b"), make_cluster(num_gpus=16, gpu="gb200")
    pins = {"tp": 1, "pp": 1, "cp": 1, "ep": 8, "micro_batch": 2, "moe_dispatcher": "alltoall"}
    result = plan_search(load_space("megatron"), model, cluster, pins=pins, global_batch=128, seq_len=4096)
    by_plan = {e.plan: e for e in result.feasible}
    offloaded = [e for e in result.feasible if e.plan.offload_modules]
    pairs = [
        (by_plan[e.plan.replace(offload_modules=())], e)
        for e in offloaded
        if e.plan.replace(offload_modules=()) in by_plan
    ]
    assert pairs and all(on.memory_bytes_per_gpu < off.memory_bytes_per_gpu for off, on in pairs)
    assert all(on.step_time_s >= off.step_time_s for off, on in pairs)
    assert "the experts' activation offload has nothing to move under full recompute" in result.pruned
    dense = resolve_choices(load_space("megatron"), load_model("llama3-8b"), cluster)
    assert dense["offload_modules"] == ((),)
