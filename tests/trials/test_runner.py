"""Tier 0: the runner's command line, trial.json and status classification, on fabricated trial dirs."""

from __future__ import annotations

import json
import os
import shlex
import time

import pytest
from trial_helpers import make_request

from autotune.catalog import make_cluster
from autotune.plan import ParallelPlan
from autotune.trials.result import TrialResult, TrialStatus
from autotune.trials.runner import (
    Launch,
    _classify,
    _Progress,
    launch_command,
    live_trial_pids,
    trial_config,
)

PLAN = ParallelPlan(dp=2, global_batch=4, seq_len=32)


def test_standalone_and_multi_node_commands(tmp_path):
    local = launch_command(tmp_path, nproc=2, launch=Launch(python="py"))
    assert local == [
        "py",
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc_per_node",
        "2",
        "--rdzv_backend",
        "c10d",
        "--max_restarts",
        "0",
        "--standalone",
        "-m",
        "autotune.trials.worker",
        "--trial-dir",
        str(tmp_path),
    ]
    launch = Launch(python="py", nnodes=2, node_rank=1, rdzv_endpoint="n0:29500", rdzv_conf="join_timeout=60")
    multi = launch_command(tmp_path, nproc=8, launch=launch)
    assert "--standalone" not in multi
    joined = shlex.join(multi)
    assert "--nnodes 2 --nproc_per_node 8 --rdzv_backend c10d" in joined
    assert "--rdzv_endpoint n0:29500 --rdzv_id autotune --rdzv_conf join_timeout=60 --node_rank 1" in joined


def test_trial_config_device_and_peak(tiny, tmp_path):
    cpu = trial_config(make_request(tiny, PLAN, tmp_path))
    assert cpu.device == "cpu" and cpu.peak_flops_per_gpu == pytest.approx(0.1e12)  # catalog cpu fp32
    h100 = make_request(tiny, PLAN, tmp_path)
    h100 = type(h100)(
        **{
            **{f: getattr(h100, f) for f in h100.__slots__},
            "cluster": make_cluster(num_gpus=2, gpu="h100-sxm"),
        }
    )
    gpu = trial_config(h100, seed=9)
    assert gpu.device == "auto" and gpu.seed == 9
    assert gpu.peak_flops_per_gpu == pytest.approx(989.4e12, rel=0.01)
    assert trial_config(h100, device="cpu").peak_flops_per_gpu == pytest.approx(0.1e12)


def _write(path, result: TrialResult) -> None:
    result.write(path)
    time.sleep(0.01)  # distinct mtimes: the first rank to fail is the root cause


def _classified(trial_dir, returncode=1, **kw):
    kw = {"timed_out": False, "pruned": False, "timeout_s": 10.0} | kw
    return _classify(trial_dir, returncode, **kw)


def test_rank_zero_result_wins(tmp_path):
    (tmp_path / "started.0").write_text("1\n")
    TrialResult(status=TrialStatus.OK, tokens_per_s=5.0).write(tmp_path / "result.json")
    assert _classified(tmp_path, 0).tokens_per_s == 5.0


def test_oom_on_any_rank_beats_the_peers_broken_connections(tmp_path):
    (tmp_path / "started.0").write_text("1\n")
    _write(tmp_path / "result.rank0.json", TrialResult(status=TrialStatus.ERROR, error="rank 0: peer closed"))
    _write(tmp_path / "result.rank1.json", TrialResult(status=TrialStatus.OOM, error="rank 1: OutOfMemory"))
    (tmp_path / "stderr.log").write_text("line 1\nlast line\n")
    result = _classified(tmp_path)
    assert result.status is TrialStatus.OOM
    assert result.error == "rank 1: OutOfMemory\n--- stderr tail ---\nline 1\nlast line"


def test_first_failure_is_the_root_cause(tmp_path):
    (tmp_path / "started.0").write_text("1\n")
    _write(tmp_path / "result.rank1.json", TrialResult(status=TrialStatus.ERROR, error="rank 1: boom"))
    _write(tmp_path / "result.rank0.json", TrialResult(status=TrialStatus.ERROR, error="rank 0: peer closed"))
    assert _classified(tmp_path).error.startswith("rank 1: boom")


def test_exit_paths_without_a_result(tmp_path):
    assert _classified(tmp_path, -9, timed_out=True).status is TrialStatus.TIMEOUT
    assert _classified(tmp_path, -15, pruned=True).status is TrialStatus.PRUNED
    assert _classified(tmp_path, 1).status is TrialStatus.RENDEZVOUS_ERROR  # no worker ever started
    (tmp_path / "started.0").write_text("1\n")
    died = _classified(tmp_path, -11)
    assert died.status is TrialStatus.ERROR
    assert died.error.startswith("workers died without a result (torchrun signal 11)")


def test_progress_forwards_complete_lines_only(tmp_path):
    path = tmp_path / "progress.jsonl"
    seen = []
    progress = _Progress(path, lambda step, tps: seen.append((step, tps)) or step >= 1)
    assert progress.poll() is False
    path.write_text(json.dumps({"step": 0, "tokens_per_s": 10.0}) + "\n" + '{"step": 1, "tok')
    assert progress.poll() is False and seen == [(0, 10.0)]
    with path.open("a") as f:
        f.write('ens_per_s": 12.5}\n')
    assert progress.poll() is True and seen == [(0, 10.0), (1, 12.5)]


def test_live_trial_pids_needs_the_trial_dir_flag(tmp_path):
    """A process that merely mentions the directory (this test, a shell) is never a trial's process."""
    assert os.getpid() not in live_trial_pids(tmp_path)
    assert live_trial_pids(tmp_path) == []
