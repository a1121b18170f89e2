"""The GPU validation script's CPU smoke mode, and a real trial on CUDA (skipped without a GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trial_helpers import make_request

from autotune.backends.torchrun import TorchrunBackend
from autotune.catalog import make_cluster
from autotune.plan import ParallelPlan
from autotune.trials.result import TrialStatus

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.dist(timeout=120)
def test_gpu_validate_dry_run_writes_partial_results_and_predictions(tmp_path):
    env = os.environ | {"PYTHON": sys.executable}
    subprocess.run(
        [
            str(ROOT / "benchmarks" / "gpu_validate.sh"),
            "--dry-run",
            "--out",
            str(tmp_path),
            "--trials-dir",
            str(tmp_path / "trials"),
            "--warmup",
            "1",
            "--steps",
            "2",
        ],
        check=True,
        env=env,
        timeout=110,
        capture_output=True,
    )
    doc = json.loads((tmp_path / "gpu_validate_dry.json").read_text())
    assert [r["status"] for r in doc["results"]] == ["ok", "ok"]
    assert [r["fsdp"] for r in doc["results"]] == ["none", "fsdp-full"]
    for row in doc["results"]:
        assert row["step_time_s"] > 0 and row["peak_allocated_bytes"] > 0
        assert row["predicted"]["step_time_s"] > 0 and row["step_time_error"] is not None
    table = (tmp_path / "gpu_validate_dry.md").read_text()
    assert "| mbs2-rc_full-fsdp | ok |" in table
    assert (tmp_path / "trials" / "mbs1-rc_none-nofsdp" / "result.json").exists()


@pytest.mark.slow
def test_gpu_validate_imports_neither_deepspeed_nor_optuna():
    code = (
        "import sys, benchmarks.gpu_validate; "
        "bad = sorted({m.split('.')[0] for m in sys.modules} & {'deepspeed', 'optuna'}); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_trial_on_one_gpu(tiny, tmp_path):
    plan = ParallelPlan(global_batch=4, micro_batch=2, seq_len=128)
    request = make_request(tiny, plan, tmp_path / "cuda", timeout_s=300)
    request = type(request)(
        **{
            **{f: getattr(request, f) for f in request.__slots__},
            "cluster": make_cluster(num_gpus=1, gpu="h100-sxm"),
        }
    )
    result = TorchrunBackend(device="cuda").run(request)
    assert result.status is TrialStatus.OK, result.error
    assert result.extra["device"] == "cuda"
    assert result.extra["peak_memory_method"] == "torch.cuda.max_memory_allocated"
    assert 0 < result.peak_memory_bytes <= result.extra["peak_reserved_bytes"]
    assert 0 < result.mfu < 1
