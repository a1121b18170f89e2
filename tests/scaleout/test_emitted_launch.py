"""The emitted launch files run the user's own script (the bundled example) on CPU, started only from a copy
of the emitted folder in another directory (the planning folder is deleted first): ``launch_torchrun.sh``,
``launch_deepspeed.sh``, ``launch_slurm.sbatch`` submitted with ``sbatch`` to the local Slurm, and the
PyTorchJob's container command run as the operator would start it (its PET_* variables, the ConfigMap laid
out as the manifest's ``items`` say). Each run must see the plan: the example trains the plan's batch and
reports tokens/s from it, and the step count comes from the contract's variables."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autotune.catalog import load_model, make_cluster
from autotune.emit import emit_all
from autotune.plan import ParallelPlan

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_script" / "train.py"
MEASURE_STEPS = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _best_copy(tmp_path: Path, nodes: int = 1, **plan_fields) -> tuple[ParallelPlan, Path, Path]:
    """Emit a 2-rank CPU plan, copy ``best/`` and the user's script elsewhere, delete the original."""
    plan = ParallelPlan(dp=2, micro_batch=2, global_batch=8, seq_len=64, **plan_fields)
    planned = tmp_path / "laptop" / "best"
    cluster = make_cluster(num_gpus=2, gpu="cpu", gpus_per_node=2 // nodes)
    emit_all(plan, load_model("tiny"), cluster, None, planned)
    cluster_dir = tmp_path / "on the cluster"
    shutil.copytree(planned, cluster_dir / "best")
    shutil.copy(EXAMPLE, cluster_dir / "train.py")
    shutil.rmtree(tmp_path / "laptop")
    return plan, cluster_dir / "best", cluster_dir / "train.py"


def _env(**extra: str) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)  # torchrun, deepspeed and python of this environment
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "OMP_NUM_THREADS": "1",
        "AUTOTUNE_WARMUP_STEPS": "1",
        "AUTOTUNE_MEASURE_STEPS": str(MEASURE_STEPS),
        "MASTER_PORT": str(_free_port()),
        "DS_ACCELERATOR": "cpu",
        **extra,
    }


def _assert_ran_the_plan(plan: ParallelPlan, trial_dir: Path, log: str) -> None:
    result_path = trial_dir / "result.json"
    assert result_path.exists(), log[-3000:]
    result = json.loads(result_path.read_text())
    assert result["status"] == "ok", result
    tokens = result["tokens_per_s"] * result["step_time_s"]  # contract.report: the plan's tokens per step
    assert tokens == pytest.approx(plan.global_batch * plan.seq_len)
    steps = (trial_dir / "progress.jsonl").read_text().splitlines()
    assert len(steps) == MEASURE_STEPS


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: int) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    return log


@pytest.mark.slow
@pytest.mark.dist(timeout=400)
def test_torchrun_script_runs_the_example(tmp_path):
    plan, best, script = _best_copy(tmp_path, sharding="fsdp-full")
    log = _run(["bash", str(best / "launch_torchrun.sh"), str(script)], tmp_path, _env(), 360)
    _assert_ran_the_plan(plan, best / "trial", log)


@pytest.mark.slow
@pytest.mark.dist(timeout=600)
def test_deepspeed_script_runs_the_example(tmp_path):
    """ZeRO-1 from ``ds_config.json`` (``AUTOTUNE_DS_CONFIG``); the first run on a machine builds DeepSpeed's
    CPU communication op (``.ci/run`` builds it before the tests)."""
    pytest.importorskip("deepspeed")
    plan, best, script = _best_copy(tmp_path, sharding="zero1", framework="deepspeed")
    log = _run(["bash", str(best / "launch_deepspeed.sh"), "train.py"], script.parent, _env(), 560)
    _assert_ran_the_plan(plan, best / "trial", log)


@pytest.mark.slow
@pytest.mark.dist(timeout=400)
def test_pytorchjob_container_runs_the_example(tmp_path):
    """The Master pod's command as the operator runs it: the ConfigMap's keys at their ``items`` paths under
    the (read-only) config mount, an empty writable run directory, torchrun's PET_* variables."""
    plan, best, script = _best_copy(tmp_path, sharding="fsdp-full")
    job = yaml.safe_load((best / "pytorchjob.yaml").read_text())
    pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    (container,) = pod["containers"]
    config, run = tmp_path / "config", tmp_path / "run"
    for item in pod["volumes"][0]["configMap"]["items"]:  # kubectl create configmap ... --from-file=<path>
        (config / item["path"]).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(best / item["path"], config / item["path"])
    config.chmod(0o555)
    run.mkdir()
    env = _env(
        AUTOTUNE_CONFIG_DIR=str(config),
        RUN_DIR=str(run),
        PET_NNODES="1",
        PET_NPROC_PER_NODE=job["spec"]["nprocPerNode"],
        PET_NODE_RANK="0",
        PET_MASTER_ADDR="127.0.0.1",
        PET_MASTER_PORT=str(_free_port()),
    )
    log = _run([*container["command"], str(script)], tmp_path, env, 360)
    _assert_ran_the_plan(plan, run / "trial", log)


@pytest.mark.slow
@pytest.mark.dist(timeout=600)
@pytest.mark.parametrize("nodes", [1, 2])
def test_sbatch_runs_the_example_from_a_copy_of_best(slurm, tmp_path, nodes):
    """``sbatch <copy>/best/launch_slurm.sbatch train.py`` in the script's folder: the job finds ``best/``
    through Slurm (it runs a spooled copy of the file) and runs the script to completion on 1 node, or on
    2 (one torchrun agent per node, joined at MASTER_ADDR)."""
    plan, best, script = _best_copy(tmp_path, nodes, sharding="fsdp-full")
    # the local nodes have CPUs and no GPU gres: the command line overrides the file's --gpus-per-node
    argv = [
        "sbatch",
        "--wait",
        "--gpus-per-node=0",
        "--time=8",
        f"--chdir={script.parent}",
        str(best / "launch_slurm.sbatch"),
        "train.py",
    ]
    # the emulated nodes' names do not resolve: MASTER_ADDR overrides the first node's name
    done = slurm.run(*argv, env=_env(MASTER_ADDR="127.0.0.1"), timeout=560, check=False)
    logs = "\n".join(p.read_text(errors="replace") for p in script.parent.glob("*.out"))
    assert done.returncode == 0, done.stdout + done.stderr + logs[-3000:]
    _assert_ran_the_plan(plan, best / "trial", logs)
