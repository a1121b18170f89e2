"""`autotune search` end to end in planning mode on the real cost model: the JSON contract, resume, and bad
input (one line, exit 2, nothing written)."""

import json
from pathlib import Path

import optuna
import pytest

from autotune.cli import main

_ESTIMATE_KEYS = {
    "feasible",
    "reasons",
    "memory_bytes_per_gpu",
    "memory_breakdown",
    "step_time_s",
    "time_breakdown",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "tflops_per_gpu",
    "bottleneck",
    "plan",
}


def _search(capsys, tmp_path, *argv):
    code = main(["search", *argv, "--out", str(tmp_path / "runs")])
    out, err = capsys.readouterr()
    return code, out, err


def _json(capsys, tmp_path, *argv):
    code, out, err = _search(capsys, tmp_path, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.slow
def test_json_has_the_estimate_keys_and_the_search_around_them(capsys, tmp_path):
    out = _json(capsys, tmp_path, "--model", "7b", "--gpus", "8", "--global-batch", "64", "--top", "3")
    assert _ESTIMATE_KEYS <= set(out)
    assert {"study", "storage", "trials", "pruned_by_reason", "emitted", "top"} <= set(out)
    assert out["feasible"] is True and out["study"] == "7b-8xh100-sxm" and out["value_source"] == "predicted"
    assert out["storage"] == f"sqlite:///{tmp_path / 'runs' / '7b-8xh100-sxm' / 'study.db'}"
    assert out["trials"]["launched_this_run"] == 3 and len(out["top"]) == 3
    assert out["top"][0]["tokens_per_s"] == pytest.approx(out["tokens_per_s"])
    assert out["pruned_by_reason"] and all(isinstance(n, int) for n in out["pruned_by_reason"].values())
    assert all(Path(p).is_file() for p in out["emitted"])
    summary = tmp_path / "runs" / "7b-8xh100-sxm" / "summary.json"
    assert json.loads(summary.read_text())["plan"] == out["plan"]


@pytest.mark.slow
def test_text_shows_the_table_the_pruned_reasons_and_that_it_only_planned(capsys, tmp_path):
    code, out, err = _search(capsys, tmp_path, "--model", "7b", "--gpus", "8", "--global-batch", "64")
    assert code == 0
    assert "planning with the cost model" in err and "run the same command on the GPU node" in err
    for needle in ("legal plans", "pruned", "pred tok/s", "MFU", "memory/GPU", "binds", "best "):
        assert needle in out
    assert "meas tok/s" not in out


@pytest.mark.slow
def test_more_trials_than_top_k_let_tpe_propose(capsys, tmp_path):
    out = _json(
        capsys,
        tmp_path,
        "--model",
        "7b",
        "--gpus",
        "8",
        "--global-batch",
        "64",
        "--top",
        "2",
        "--trials",
        "8",
        "--backend",
        "simulate",
    )
    assert out["trials"]["launched_this_run"] == 8
    assert out["trials"]["total"] >= 8


@pytest.mark.slow
def test_resume_adds_trials_and_a_new_run_needs_resume_or_force(capsys, tmp_path):
    argv = ("--model", "7b", "--gpus", "8", "--global-batch", "64", "--study", "s1", "--top", "2")
    first = _json(capsys, tmp_path, *argv)
    code, _, err = _search(capsys, tmp_path, *argv)
    assert code == 2 and "already exists" in err and "--resume" in err and len(err.strip().splitlines()) == 1
    again = _json(capsys, tmp_path, *argv, "--resume", "--trials", "3")
    assert again["storage"] == first["storage"]
    assert again["trials"]["total"] > first["trials"]["total"]
    fresh = _json(capsys, tmp_path, *argv, "--force")
    assert fresh["trials"]["total"] == first["trials"]["total"]


@pytest.mark.slow
def test_a_study_name_for_another_model_is_refused_and_left_alone(capsys, tmp_path):
    _json(
        capsys,
        tmp_path,
        "--model",
        "7b",
        "--gpus",
        "8",
        "--global-batch",
        "64",
        "--study",
        "s2",
        "--top",
        "1",
    )
    study_dir = tmp_path / "runs" / "s2"
    before = _contents(study_dir)
    code, _, err = _search(
        capsys, tmp_path, "--model", "13b", "--gpus", "8", "--global-batch", "64", "--study", "s2", "--resume"
    )
    assert code == 2 and "study 's2' was made for 7b" in err and len(err.strip().splitlines()) == 1
    assert _contents(study_dir) == before


def _contents(study_dir):
    """The marker and summary bytes and the study's trials (SQLite's own files change as it checkpoints)."""
    study = optuna.load_study(study_name="s2", storage=f"sqlite:///{study_dir / 'study.db'}")
    files = {name: (study_dir / name).read_bytes() for name in ("study.json", "summary.json")}
    return files, [(t.number, t.state, t.value, t.params) for t in study.trials]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "70b", "--gpus", "12", "--gpus-per-node", "8"], "not a multiple of --gpus-per-node 8"),
        (
            ["--model", "70b", "--gpus", "16", "--tp", "8", "--pp", "1", "--cp", "1", "--global-batch", "3"],
            "--global-batch 3: no DP x micro-batch of a legal layout divides it (DP can be 2); "
            "try --global-batch",
        ),
        pytest.param(
            ["--model", "70b", "--gpus", "1"], "70b fits nowhere on 1 h100-sxm", marks=pytest.mark.slow
        ),
        (["--model", "13b", "--gpus", "16", "--tp", "16"], "TP does not divide the attention heads"),
        (["--model", "7b", "--gpus", "8", "--resume", "--force"], "pass one"),
        (["--model", "7b", "--gpus", "8", "--space", "SPACE"], "unknown knob 'zero_stage'; allowed: tp, pp"),
        (
            ["--model", "7b", "--gpus", "8", "--framework", "megatron", "--backend", "torchrun"],
            "cannot be measured here",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(capsys, tmp_path, argv, message):
    space = tmp_path / "bad.yaml"
    space.write_text("tp: [1, 2]\nzero_stage: [1, 2]\n")
    code, out, err = _search(capsys, tmp_path, *[str(space) if a == "SPACE" else a for a in argv])
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_model_that_fits_nowhere_is_told_the_smallest_cluster(capsys, tmp_path):
    code, _, err = _search(capsys, tmp_path, "--model", "70b", "--gpus", "1")
    assert code == 2
    n = int(err.rsplit("--gpus ", 1)[1])
    assert n > 1 and n & (n - 1) == 0  # a doubling of 1 GPU
    assert _json(capsys, tmp_path, "--model", "70b", "--gpus", str(n))["feasible"] is True


@pytest.mark.slow
def test_70b_on_16_h100_is_sane(capsys, tmp_path):
    out = _json(capsys, tmp_path, "--model", "70b", "--gpus", "16")
    plan = out["plan"]
    assert plan["tp"] <= 8 and 8 % plan["tp"] == 0  # TP inside a node
    assert plan["tp"] * plan["pp"] * plan["dp"] * plan["cp"] == 16
    assert out["memory_bytes_per_gpu"] <= out["memory_capacity_bytes"]
    assert 0.2 < out["mfu"] < 0.75
    assert out["pruned_by_reason"].get("out of memory", 0) > 0


def test_a_study_that_would_be_refused_is_refused_before_the_plans_are_ranked(capsys, tmp_path, monkeypatch):
    """Ranking takes minutes on a large cluster; a rerun without --resume (or for another model) must not
    wait for it to learn that the study exists."""
    argv = ("--model", "7b", "--gpus", "8", "--global-batch", "64", "--study", "s3", "--top", "1")
    _json(capsys, tmp_path, *argv)

    def no_ranking(*args, **kwargs):
        raise AssertionError("the plans were ranked before the study was checked")

    monkeypatch.setattr("autotune.ranking.plan_search", no_ranking)
    code, _, err = _search(capsys, tmp_path, *argv)
    assert code == 2 and "study 's3' already exists" in err and len(err.strip().splitlines()) == 1
    code, _, err = _search(
        capsys, tmp_path, "--model", "13b", "--gpus", "8", "--global-batch", "64", "--study", "s3", "--resume"
    )
    assert code == 2 and "study 's3' was made for 7b" in err
    with pytest.raises(AssertionError, match="ranked before"):  # --force replaces it: the ranking runs
        main(["search", *argv, "--force", "--out", str(tmp_path / "runs")])
