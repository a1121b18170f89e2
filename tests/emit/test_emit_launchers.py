"""torchrun_args.txt and the launch scripts.

torchrun arguments are parsed by torch's own ``torch.distributed.run`` parser (and turned into its
``LaunchConfig``); DeepSpeed launcher arguments by ``deepspeed.launcher.runner.parse_args``. The scripts
are checked with ``bash -n`` and then *run* with stub ``torchrun``/``deepspeed``/``srun``/``scontrol``
binaries that record their argv, from an output folder whose name has a space, so quoting is checked end
to end.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from emit_cases import CASES
from torch.distributed.run import config_from_args, get_args_parser

from autotune.emit.torchrun import WORKER_MODULE

SCRIPTS = ("launch_torchrun.sh", "launch_deepspeed.sh", "launch_slurm.sbatch")


@pytest.fixture
def stubs(tmp_path):
    """A bin/ folder of recording stubs; ``run(script, *args, env=...) -> [argv, ...]``."""
    bin_dir, log = tmp_path / "bin", tmp_path / "argv.jsonl"
    bin_dir.mkdir()
    recorder = (
        f"#!{sys.executable}\nimport json, os, sys\n"
        "argv = [os.path.basename(sys.argv[0]), *sys.argv[1:]]\n"
        f"open({str(log)!r}, 'a').write(json.dumps(argv) + '\\n')\n"
    )
    for name in ("torchrun", "deepspeed", "srun"):
        (bin_dir / name).write_text(recorder)
        (bin_dir / name).chmod(0o755)
    (bin_dir / "scontrol").write_text(  # `show job` names the submitted script, as Slurm does
        '#!/bin/sh\nif [ "$2" = job ]; then echo "   Command=$STUB_COMMAND"\n'
        "else printf 'node-a\\nnode-b\\n'; fi\n"
    )
    (bin_dir / "scontrol").chmod(0o755)

    def run(script: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        full_env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path), **(env or {})}
        log.unlink(missing_ok=True)
        done = subprocess.run(
            ["bash", str(script), *args],
            env=full_env,
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=30,
        )
        done.argvs = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        return done

    return run


def _torchrun(argv: list[str]):
    args = get_args_parser().parse_args(argv)
    config, cmd, cmd_args = config_from_args(args)
    return args, config, cmd_args


@pytest.mark.parametrize("name", list(CASES))
def test_torchrun_args_parse_with_torchrun(name, emitted):
    _, _, cluster = CASES[name].build()
    argv = shlex.split((emitted(name) / "torchrun_args.txt").read_text())
    args, config, cmd_args = _torchrun(argv)
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (
        cluster.num_nodes,
        cluster.num_nodes,
        cluster.gpus_per_node,
    )
    assert config.rdzv_backend == "c10d" and config.max_restarts == 0
    assert args.module and args.training_script == WORKER_MODULE
    assert cmd_args[-3:] == [WORKER_MODULE, "--trial-dir", "trial"]


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_are_valid_bash(name, script, emitted):
    path = emitted(name) / script
    if not path.exists():
        assert script == "launch_deepspeed.sh"
        return
    assert os.access(path, os.X_OK)
    subprocess.run(["bash", "-n", str(path)], check=True)


def test_torchrun_script_rendezvous_and_quoted_paths(emitted, stubs):
    out = emitted("fsdp_full")  # 2 nodes
    done = stubs(out / "launch_torchrun.sh", env={"MASTER_ADDR": "node-a", "MASTER_PORT": "1234"})
    assert done.returncode == 0, done.stderr
    (argv,) = done.argvs
    assert argv[0] == "torchrun" and " " in str(out)
    args, config, _ = _torchrun(argv[1:])
    assert config.rdzv_endpoint == "node-a:1234" and config.min_nodes == 2 and config.nproc_per_node == 8
    assert args.rdzv_id.startswith("autotune-")
    assert args.training_script_args == ["--trial-dir", str(out / "trial")]


def test_torchrun_script_runs_a_user_entry_point(emitted, stubs):
    done = stubs(emitted("zero0") / "launch_torchrun.sh", "my train.py", "--lr", "3e-4")
    assert done.returncode == 0, done.stderr  # one node: MASTER_ADDR defaults to localhost
    args, config, _ = _torchrun(done.argvs[0][1:])
    assert config.rdzv_endpoint == "localhost:29500"
    assert (args.training_script, args.training_script_args) == ("my train.py", ["--lr", "3e-4"])


def test_multi_node_torchrun_needs_master_addr(emitted, stubs):
    done = stubs(emitted("fsdp_full") / "launch_torchrun.sh")
    assert done.returncode != 0 and "MASTER_ADDR" in done.stderr and not done.argvs


def test_slurm_script_one_agent_per_node(emitted, stubs):
    out = emitted("hsdp")  # 4 nodes
    sbatch = (out / "launch_slurm.sbatch").read_text()
    for header in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8"):
        assert header in sbatch
    env = {
        "SLURM_JOB_NODELIST": "node-[a-d]",
        "SLURM_JOB_ID": "42",
        "STUB_COMMAND": str(out / "launch_slurm.sbatch"),
    }
    done = stubs(out / "launch_slurm.sbatch", env=env)
    assert done.returncode == 0, done.stderr
    (argv,) = done.argvs
    assert argv[:4] == ["srun", "--nodes=4", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    assert argv[4] == "torchrun"
    args, config, _ = _torchrun(argv[5:])
    assert config.rdzv_endpoint == "node-a:29500" and args.rdzv_id == "42" and config.min_nodes == 4
    # the folder comes from Slurm's record of the submitted script: sbatch runs a spooled copy
    assert args.training_script_args == ["--trial-dir", str(out / "trial")]
    assert str(out) not in sbatch  # nothing names the folder it was emitted into


def _deepspeed_runner_args(argv: list[str]):
    runner = pytest.importorskip("deepspeed.launcher.runner")
    return runner.parse_args(argv)


def test_deepspeed_script_single_node(emitted, stubs):
    out = emitted("zero0")
    done = stubs(out / "launch_deepspeed.sh", "train.py", "--lr", "1e-4")
    assert done.returncode == 0, done.stderr
    args = _deepspeed_runner_args(done.argvs[0][1:])
    assert (args.num_nodes, args.num_gpus, args.user_script) == (1, 8, "train.py")
    assert args.user_args == ["--lr", "1e-4", "--deepspeed_config", str(out / "ds_config.json")]


def test_deepspeed_script_multi_node_reads_a_hostfile(emitted, stubs, tmp_path):
    out = emitted("zero2")  # 2 nodes
    assert stubs(out / "launch_deepspeed.sh", "train.py").returncode == 2  # no hostfile yet
    hostfile = tmp_path / "my hosts"
    hostfile.write_text("# nodes\nnode-a slots=8\nnode-b slots=8\n")
    env_file = tmp_path / "ds env"
    done = stubs(
        out / "launch_deepspeed.sh", "train.py", env={"HOSTFILE": str(hostfile), "DS_ENV_FILE": str(env_file)}
    )
    assert done.returncode == 0, done.stderr
    args = _deepspeed_runner_args(done.argvs[0][1:])
    assert (args.num_nodes, args.num_gpus, args.hostfile, args.master_addr) == (2, 8, str(hostfile), "node-a")
    assert args.user_args[-2:] == ["--deepspeed_config", str(out / "ds_config.json")]
    # pdsh passes the remote ranks only what the runner reads from DS_ENV_FILE: the contract is in it
    exported = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
    assert shlex.split(exported["AUTOTUNE_PLAN"]) == [str(out / "trial" / "plan.json")]  # quoted: a space


def test_deepspeed_script_needs_a_training_script(emitted, stubs):
    done = stubs(emitted("zero0") / "launch_deepspeed.sh")
    assert done.returncode == 2 and "usage" in done.stderr
