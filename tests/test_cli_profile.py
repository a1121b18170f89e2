"""`--profile P` on estimate and search: the profile's measured numbers replace the catalog's, visibly."""

from __future__ import annotations

import json

import pytest
import yaml

from autotune.catalog import load_model, make_cluster
from autotune.cli import main
from autotune.costmodel import estimate
from autotune.plan import ParallelPlan
from autotune.probe.profile import with_profile

_PROFILE = {
    "name": "cpu-test",
    "kind": "probe",
    "measured": "2026-11-30 12:00:00",
    "gpu": "cpu",
    "gpu_overrides": {
        "fp32_tflops": 0.02,
        "bf16_tflops": 0.02,
        "gemm_efficiency": 0.8,
        "memory_bandwidth_gb_s": 6.4,
    },
    "intra_node_link": {"bw_gb_s": 0.5, "latency_us": 200.0},
    "cluster": {"collective_efficiency": 1.0},
}
_CLUSTER = ["--model", "tiny", "--gpus", "2", "--gpu", "cpu"]


@pytest.fixture
def profile(tmp_path):
    path = tmp_path / "cpu-test.yaml"
    path.write_text(yaml.safe_dump(_PROFILE))
    return path


def _estimate(capsys, *extra):
    argv = [
        "estimate",
        *_CLUSTER,
        "--dp",
        "2",
        "--sharding",
        "fsdp-full",
        "--global-batch",
        "4",
        "--seq-len",
        "64",
        *extra,
    ]
    assert main(argv) == 0
    return capsys.readouterr().out


def test_estimate_names_the_profile_and_uses_its_numbers(capsys, profile):
    text = _estimate(capsys, "--profile", str(profile))
    assert "hardware  profile: cpu-test (measured 2026-11-30)" in text
    with_p = json.loads(_estimate(capsys, "--profile", str(profile), "--json"))
    without = json.loads(_estimate(capsys, "--json"))
    assert with_p["profile"] == "profile: cpu-test (measured 2026-11-30)" and without["profile"] is None
    # 0.02 TF x 0.8 instead of the catalog's 0.1 TF x 0.5, and 6.4 instead of 20 GB/s: compute 3.125x slower
    ratio = with_p["time_breakdown"]["compute_s"] / without["time_breakdown"]["compute_s"]
    assert ratio == pytest.approx(0.1 * 0.5 / (0.02 * 0.8))
    assert with_p["time_breakdown"]["dp_comm_total_s"] > without["time_breakdown"]["dp_comm_total_s"]


@pytest.mark.slow
def test_search_ranks_with_the_profile_and_records_it(tmp_path, capsys, profile):
    argv = [
        "search",
        *_CLUSTER,
        "--backend",
        "simulate",
        "--global-batch",
        "8",
        "--seq-len",
        "64",
        "--out",
        str(tmp_path),
        "--study",
        "p",
        "--trials",
        "3",
        "--profile",
        str(profile),
    ]
    assert main(argv) == 0
    assert "hardware  profile: cpu-test (measured 2026-11-30)" in capsys.readouterr().out
    summary = json.loads((tmp_path / "p" / "summary.json").read_text())
    cluster = with_profile(make_cluster(num_gpus=2, gpu="cpu"), profile)
    best = ParallelPlan.from_dict(summary["plan"])
    assert summary["step_time_s"] == pytest.approx(estimate(load_model("tiny"), cluster, best).step_time_s)
    assert json.loads((tmp_path / "p" / "study.json").read_text())["profile"] == str(profile)
    assert "calibration" not in summary  # predictions only: nothing measured to fit


def test_a_missing_profile_is_one_line_exit_2(capsys, tmp_path):
    assert main(["estimate", *_CLUSTER, "--profile", str(tmp_path / "none.yaml")]) == 2
    err = capsys.readouterr().err
    assert "run `autotune probe` first" in err and err.count("\n") == 1


def test_scale_applies_the_profile_at_every_count(capsys, profile):
    argv = [
        "scale",
        "--model",
        "tiny",
        "--gpu",
        "cpu",
        "--gpus",
        "1,2",
        "--global-batch",
        "8",
        "--seq-len",
        "64",
        "--json",
    ]
    assert main(argv) == 0
    without = json.loads(capsys.readouterr().out)
    assert main([*argv, "--profile", str(profile)]) == 0
    with_p = json.loads(capsys.readouterr().out)
    for a, b in zip(with_p["points"], without["points"], strict=True):
        assert a["num_gpus"] == b["num_gpus"] and a["tokens_per_s"] < b["tokens_per_s"]  # a slower machine
