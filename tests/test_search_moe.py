"""Searching an MoE model: expert parallelism is in the space, and a model too large for a cluster says so."""

import json

import pytest

from autotune.cli import main


@pytest.mark.slow
def test_deepseek_v3_on_512_h100_gets_an_expert_parallel_plan(tmp_path):
    assert (
        main(
            [
                "search",
                "--model",
                "deepseek-v3",
                "--gpus",
                "512",
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
