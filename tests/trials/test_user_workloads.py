"""``--workload`` and ``--script``: checked before any trial, run end to end on 2 CPU ranks; the contract.

Tier 0: bad ``--workload`` / ``--script`` values are one line (exit 2) before anything is written; the
contract's files. Tier 2 (``dist``): each example in ``examples/`` runs a short real search, and a script
that exits 0 without reporting is an ``error`` that says so.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import optuna
import pytest
import torch
from trial_helpers import make_request

from autotune import contract
from autotune.backends.registry import BackendChoice, apply_pins, get_backend, trial_options
from autotune.backends.torchrun import TorchrunBackend
from autotune.catalog import load_model, make_cluster
from autotune.cli import main
from autotune.emit import accelerate_unsupported
from autotune.errors import ConfigError
from autotune.plan import ParallelPlan, Recompute
from autotune.trials.config import TrialConfig
from autotune.trials.result import TrialResult, TrialStatus
from autotune.trials.script import NO_RESULT, script_env, write_script_configs
from autotune.workload import load_builder

ROOT = Path(__file__).resolve().parents[2]
CPU_SEARCH = [
    "--model",
    "tiny",
    "--gpus",
    "2",
    "--gpu",
    "cpu",
    "--device",
    "cpu",
    "--backend",
    "torchrun",
    "--global-batch",
    "8",
    "--seq-len",
    "64",
    "--top",
    "2",
    "--quiet",
]


def _cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    return code, err.getvalue()


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--workload", "examples.custom_workload.build", "expected MODULE:FUNCTION"),
        ("--workload", "no_such_pkg.models:build", "cannot import no_such_pkg.models (ModuleNotFoundError"),
        ("--workload", "examples.custom_workload.build:nope", "custom_workload.build.nope does not exist"),
        ("--script", "examples/no_such_script.py", "no such file"),
    ],
)
def test_bad_workload_or_script_is_one_line_before_any_trial(tmp_path, monkeypatch, flag, value, says):
    monkeypatch.chdir(ROOT)
    code, err = _cli(["search", *CPU_SEARCH, "--trials", "1", flag, value, "--out", str(tmp_path)])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and says in lines[0], err
    assert not any(tmp_path.iterdir())  # no study, no trial directory


def test_workload_needs_real_trials_and_pins_pp_cp(monkeypatch):
    monkeypatch.chdir(ROOT)
    options = trial_options(workload="examples.custom_workload.build:build")
    assert options["workload_root"] == str(ROOT) and options["peak_flops_per_gpu"] is None
    with pytest.raises(ConfigError, match="real trials"):
        get_backend("simulate", cluster=make_cluster(num_gpus=2, gpu="cpu"), options=options)
    cluster = make_cluster(num_gpus=2, gpu="cpu")
    choice = get_backend("torchrun", cluster=cluster, device="cpu", options=options)
    assert apply_pins({"pp": None, "tp": 2}, choice) == {"pp": 1, "cp": 1, "ep": 1, "etp": 1, "tp": 2}
    with pytest.raises(ConfigError, match="--pp 2: pipeline and context parallelism are not applied"):
        apply_pins({"pp": 2}, choice)
    script = trial_options(script="examples/train_script/train.py")
    assert apply_pins({"pp": 2}, BackendChoice(backend=choice.backend, frameworks=None)) == {"pp": 2}
    assert Path(script["script"]).is_absolute()
    with pytest.raises(ConfigError, match="pass one"):
        trial_options(workload="a:b", script="x.py")


def test_contract_writes_the_trial_result_from_rank_zero(tmp_path, monkeypatch):
    plan = ParallelPlan(dp=2, global_batch=8, micro_batch=2, seq_len=64)
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_dict()))
    env = {
        "plan": tmp_path / "plan.json",
        "result": tmp_path / "result.json",
        "progress": tmp_path / "progress.jsonl",
    }
    for key, path in env.items():
        monkeypatch.setenv(contract.ENV[key], str(path))
    monkeypatch.setattr(contract, "_step_times_s", [])
    monkeypatch.setenv("RANK", "1")
    contract.step(1.0)
    contract.report(peak_memory_bytes=5.0)
    assert not env["result"].exists() and not env["progress"].exists()  # other ranks write nothing
    monkeypatch.setenv("RANK", "0")
    assert contract.plan()["grad_accum"] == 2 and contract.tokens_per_step() == 512
    contract.step(0.5)
    contract.step(0.25)
    contract.report(peak_memory_bytes=5.0, note="x")
    lines = [json.loads(x) for x in env["progress"].read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2] and lines[1]["tokens_per_s"] == 2048
    result = TrialResult.read(env["result"])
    assert result.status is TrialStatus.OK and result.step_time_s == 0.5  # median of 1.0, 0.5, 0.25
    assert result.tokens_per_s == 1024 and result.peak_memory_bytes == 5.0 and result.extra["note"] == "x"


def _search(tmp_path: Path, *extra: str) -> optuna.Study:
    code, err = _cli(["search", *CPU_SEARCH, *extra, "--study", "s", "--out", str(tmp_path)])
    assert code == 0, err
    return optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's' / 'study.db'}")


def _assert_measured(tmp_path: Path, study: optuna.Study) -> None:
    ok = [t for t in study.trials if t.user_attrs.get("status") == "ok"]
    assert ok and all(t.user_attrs["value_source"] == "measured" for t in ok)
    assert all(t.intermediate_values for t in ok)  # per-step tokens/s went to the pruner during the trial
    summary = (tmp_path / "s" / "best" / "summary.md").read_text()
    assert "## Measured (real trials)" in summary and "measured / predicted" in summary


@pytest.mark.dist(timeout=60)
def test_custom_workload_example_end_to_end(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    study = _search(tmp_path, "--workload", "examples.custom_workload.build:build", "--trials", "1")
    _assert_measured(tmp_path, study)
    config = json.loads(next((tmp_path / "s" / "trials").glob("*/trial.json")).read_text())
    assert config["workload"] == "examples.custom_workload.build:build"


@pytest.mark.dist(timeout=60)
def test_train_script_example_end_to_end(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    # the example runs FSDP2 data parallelism only and says so (pins as in the README)
    study = _search(
        tmp_path,
        "--script",
        "examples/train_script/train.py",
        "--tp",
        "1",
        "--pp",
        "1",
        "--cp",
        "1",
        "--trials",
        "1",
    )
    _assert_measured(tmp_path, study)
    trial_dir = next((tmp_path / "s" / "trials").glob("*/"))
    plan = ParallelPlan.from_dict(json.loads((trial_dir / "plan.json").read_text()))
    assert (trial_dir / "accelerate_fsdp.yaml").exists() == (not accelerate_unsupported(plan))
    assert not (trial_dir / "ds_config.json").exists()  # an FSDP plan: no DeepSpeed config


@pytest.mark.dist(timeout=60)
def test_script_that_reports_nothing_is_an_error(tiny, tmp_path):
    script = tmp_path / "quiet.py"
    script.write_text("import os\nassert os.environ['AUTOTUNE_PLAN']\n")
    plan = ParallelPlan(global_batch=2, seq_len=32)
    backend = TorchrunBackend(device="cpu", **trial_options(script=str(script)))
    result = backend.run(make_request(tiny, plan, tmp_path / "trial"))
    assert result.status is TrialStatus.ERROR and result.error.startswith(f"rank 0: {NO_RESULT}")


def test_a_script_gets_the_config_its_plan_can_use(tiny, tmp_path):
    cluster = make_cluster(num_gpus=2, gpu="cpu")
    ds = ParallelPlan(
        dp=2, global_batch=8, micro_batch=2, seq_len=64, sharding="zero2", framework="deepspeed"
    )
    write_script_configs(tmp_path, ds, tiny, cluster)
    env = script_env(tmp_path, TrialConfig(model=tiny, warmup_steps=1, measure_steps=3))
    assert json.loads(Path(env[contract.ENV["ds_config"]]).read_text())["train_batch_size"] == 8
    assert contract.ENV["accelerate_config"] not in env and env[contract.ENV["measure_steps"]] == "3"
    fsdp = ParallelPlan(dp=2, global_batch=8, micro_batch=2, seq_len=64, sharding="fsdp-full")
    write_script_configs(tmp_path, fsdp, tiny, cluster)  # a stale config of another plan never lingers
    env = script_env(tmp_path, TrialConfig(model=tiny))
    assert contract.ENV["ds_config"] not in env and Path(env[contract.ENV["accelerate_config"]]).exists()


def test_blocks_of_a_user_model_are_found_and_wrapped(monkeypatch):
    from autotune.trials.custom import block_slots
    from autotune.trials.parallelize import apply_ac

    monkeypatch.chdir(ROOT)
    build = load_builder("examples.custom_workload.build:build")
    workload = build(load_model("tiny"), ParallelPlan(global_batch=2, seq_len=16), torch.device("cpu"))
    slots = block_slots(workload.model, workload.block)
    assert [f"{type(p).__name__}.{n}" for p, n in slots] == [f"ModuleList.{i}" for i in range(4)]
    apply_ac(workload.model, Recompute.SELECTIVE, slots=slots, selective=workload.selective)
    assert all(isinstance(getattr(p, n), workload.block) for p, n in slots)
    assert type(workload.model.blocks[0].attn.core).__name__ == "CheckpointWrapper"
    apply_ac(workload.model, Recompute.FULL, slots=slots)
    assert all(type(getattr(p, n)).__name__ == "CheckpointWrapper" for p, n in slots)
    inputs, labels = workload.batch(0, 2, 16, torch.device("cpu"))
    assert workload.model(inputs).shape == (2, 16, 1024) and labels.shape == (2, 16)
