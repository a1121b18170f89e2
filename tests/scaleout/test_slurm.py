"""Trials on a real Slurm (``local_slurm.py``: munged, slurmctld, two ``slurmd -N`` nodes on this machine).

From ``autotune search --executor slurm`` (a job per trial, 2 nodes), the executor directly (1 node), a
hanging trial cancelled at its timeout, and ``srun`` steps inside an allocation (``salloc``). Skipped
with the reason when the Slurm binaries are not installed; the pure parts run everywhere.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from torch.distributed.run import config_from_args, get_args_parser
from trial_requests import PLAN, assert_nothing_left, make_request

from autotune.emit.command import ShellRef
from autotune.executors.slurm import SlurmExecutor, job_script, srun_command, time_limit_minutes
from autotune.executors.slurmctl import job_result
from autotune.trials.config import FAULT_ENV
from autotune.trials.result import TrialResult, TrialStatus
from autotune.trials.runner import Launch, trial_config

REPO = Path(__file__).resolve().parents[2]


def _run(executor: SlurmExecutor, request) -> TrialResult:
    return executor.run(request, config=trial_config(request, device="cpu"))


def _sbatch_flags(trial_dir: Path) -> dict[str, str]:
    argv = shlex.split((trial_dir / "cmd.txt").read_text())
    return dict(a[2:].split("=", 1) if "=" in a else (a[2:], "") for a in argv if a.startswith("--"))


def test_time_limit_is_the_timeout_in_whole_minutes():
    assert [time_limit_minutes(s) for s in (1, 60, 61, 599.5)] == [1, 1, 2, 10]


def _agent_as_task(srun: list[str], node_id: int) -> list[str]:
    """The argv one srun task's shell would exec (``SLURM_NODEID`` = ``node_id``), printed instead."""
    env = {
        "SLURM_NODEID": str(node_id),
        "SLURM_JOB_ID": "7",
        "AUTOTUNE_RDZV_ENDPOINT": "n1:20007",
        "PATH": "/bin",
    }
    return subprocess.run(
        ["bash", "-c", srun[6].replace("exec ", "exec printf '%s\\n' ", 1)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()


def test_each_task_runs_one_torchrun_agent_and_node_0_serves_the_store(tmp_path):
    srun = srun_command(
        tmp_path / "a b",
        nnodes=2,
        nproc=4,
        python="py",
        join_timeout_s=30,
        rdzv_endpoint=ShellRef("$AUTOTUNE_RDZV_ENDPOINT"),
        rdzv_id=ShellRef("$SLURM_JOB_ID"),
    )
    assert srun[:4] == ["srun", "--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    assert srun[4:6] == ["bash", "-c"]
    script = tmp_path / "job.sbatch"
    script.write_text(job_script(srun))
    subprocess.run(["bash", "-n", str(script)], check=True)
    for node_id, is_host in ((0, "1"), (1, "0")):
        agent = _agent_as_task(srun, node_id)
        assert agent[:3] == ["py", "-m", "torch.distributed.run"]
        args = get_args_parser().parse_args(agent[3:])
        config, _, cmd_args = config_from_args(args)
        assert (config.min_nodes, config.nproc_per_node, config.rdzv_endpoint) == (2, 4, "n1:20007")
        assert config.run_id == "7" and config.rdzv_configs["is_host"] == is_host
        assert config.rdzv_configs["join_timeout"] == "30"
        assert cmd_args[-2:] == ["--trial-dir", str(tmp_path / "a b")]


@pytest.mark.parametrize(
    ("state", "files", "stop", "ran", "status", "error"),
    [
        ("COMPLETED", {"result.json": "ok"}, None, True, "ok", None),
        (
            "FAILED",
            {"started.0": "", "started.1": "", "result.rank1.json": "oom"},
            None,
            True,
            "oom",
            "rank 1",
        ),
        ("FAILED", {"started.0": "", "result.rank0.json": "error"}, None, True, "error", "rank 0"),
        ("FAILED", {}, None, True, "rendezvous_error", "no worker started"),
        ("CANCELLED", {"started.0": ""}, "timeout", True, "timeout", "slurm job 9 cancelled (scancel)"),
        ("TIMEOUT", {"started.0": ""}, None, True, "timeout", "ended by Slurm's time limit"),
        ("OUT_OF_MEMORY", {"started.0": ""}, None, True, "oom", "slurm job 9 ended OUT_OF_MEMORY"),
        ("CANCELLED", {}, None, False, "error", "slurm job 9 ended CANCELLED without running"),
        ("CANCELLED", {}, "queue", False, "error", "still queued after 30 s"),
    ],
)
def test_job_outcomes_keep_the_local_failure_classes(tmp_path, state, files, stop, ran, status, error):
    """From the worker's files and the job's final state (fabricated here; the real ones are above)."""
    for name, value in files.items():
        if name.endswith(".json"):
            rank = name.split(".")[1].removeprefix("rank")
            TrialResult(status=TrialStatus(value), error=f"rank {rank}: x").write(tmp_path / name)
        else:
            (tmp_path / name).write_text("1\n")
    fields = {"JobState": state, "ExitCode": "1:0", "NodeList": "n1" if ran else "(null)", "Reason": "None"}
    result = job_result(tmp_path, "9", fields, stop, ran=ran, timeout_s=20, queue_timeout_s=30)
    assert str(result.status) == status
    assert error is None or error in result.error


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        ([{"JobState": "RUNNING"}, {"JobState": "COMPLETING"}, {"JobState": "CANCELLED"}], "CANCELLED"),
        ([{"JobState": "RUNNING"}, None], None),  # purged between two polls (MinJobAge 0)
        ([None], None),
    ],
)
def test_a_cancelled_job_whose_record_slurm_purged_is_none(monkeypatch, answers, expected):
    """``cancel_job`` against fabricated ``scontrol`` answers; the executor records None as CANCELLED (the
    real purge is ``test_a_hanging_trial_is_cancelled_at_its_timeout`` under ``MinJobAge=0``)."""
    from autotune.executors import slurmctl

    asked = iter(answers)
    monkeypatch.setattr(slurmctl, "_slurm", lambda *argv: None)
    monkeypatch.setattr(slurmctl, "job_fields", lambda job_id: next(asked))
    fields = slurmctl.cancel_job("9", poll_s=0.0)
    assert (fields or {}).get("JobState") == expected


@pytest.mark.dist(timeout=150)
def test_search_cli_runs_a_two_node_trial_as_its_own_job(slurm, tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "autotune",
        "search",
        "--model",
        "tiny",
        "--gpus",
        "2",
        "--gpus-per-node",
        "1",
        "--gpu",
        "cpu",
        "--device",
        "cpu",
        "--framework",
        "fsdp",
        "--executor",
        "slurm",
        "--trials",
        "1",
        "--top",
        "1",
        "--out",
        str(tmp_path),
        "--json",
    ]
    done = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=140,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["value_source"] == "measured" and summary["trials"]["ok"] == 1
    (result_file,) = Path(summary["study_dir"]).glob("trials/*/result.json")
    result = TrialResult.read(result_file)
    assert result.status is TrialStatus.OK and result.extra["world_size"] == 2
    assert result.extra["slurm"]["nodes"] == "n[1-2]" and result.extra["slurm"]["state"] == "COMPLETED"
    flags = _sbatch_flags(result_file.parent)
    assert flags["nodes"] == "2" and flags["ntasks-per-node"] == "1" and "gpus-per-node" not in flags
    assert flags["output"] == str(result_file.parent / "stdout.log")
    assert_nothing_left(result_file.parent)


@pytest.mark.dist(timeout=90)
def test_one_node_trial_as_a_job(slurm, tmp_path):
    request = make_request(PLAN, tmp_path / "one-node", timeout_s=61)
    result = _run(SlurmExecutor(mode="jobs"), request)
    assert result.status is TrialStatus.OK, result.error
    assert result.extra["slurm"]["nodes"] == "n1" and result.extra["world_size"] == 2
    flags = _sbatch_flags(request.trial_dir)
    assert (flags["nodes"], flags["time"]) == ("1", "2")  # 61 s, in whole minutes
    assert flags["error"] == str(request.trial_dir / "stderr.log")
    assert (request.trial_dir / "job.sbatch").exists()
    assert_nothing_left(request.trial_dir)


@pytest.mark.dist(timeout=90)
def test_a_hanging_trial_is_cancelled_at_its_timeout(slurm, tmp_path):
    request = make_request(PLAN, tmp_path / "hang", num_nodes=2, timeout_s=15)
    executor = SlurmExecutor(mode="jobs", launch=Launch(env={FAULT_ENV: "hang"}))
    start = time.monotonic()
    result = _run(executor, request)
    assert result.status is TrialStatus.TIMEOUT, result.error
    assert "cancelled (scancel)" in result.error and result.extra["slurm"]["state"] == "CANCELLED"
    assert 15 <= result.wall_s < 30 and time.monotonic() - start < 60  # the Slurm limit was 1 minute
    assert not (request.trial_dir / "progress.jsonl").exists()  # it hung before a measured step
    assert_nothing_left(request.trial_dir)


@pytest.mark.dist(timeout=150)
def test_trials_as_srun_steps_inside_an_allocation(slurm, tmp_path):
    driver = Path(__file__).with_name("alloc_driver.py")
    pythonpath = os.pathsep.join([str(REPO), str(driver.parent)])
    done = slurm.run(
        "salloc",
        "--nodes=2",
        "--time=3",
        sys.executable,
        str(driver),
        str(tmp_path),
        check=False,
        timeout=140,
        env={"PYTHONPATH": pythonpath},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["two-nodes"]["status"] == "ok", report["two-nodes"]["error"]
    assert_nothing_left(tmp_path / "two-nodes")
    srun = shlex.split(report["two-nodes"]["cmd"])
    assert srun[:2] == ["srun", "--nodes=2"] and "--nodelist=n1,n2" in srun
    assert f"--rdzv_id {report['job_id']}-autotune-two-nodes" in srun[-1]
    error = f"the trial needs 3 node(s); allocation {report['job_id']} has 2"
    assert report["three-nodes"] == {"status": "error", "cmd": None, "error": error}
