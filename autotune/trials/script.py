"""Trials of the user's own training script (``--script train.py``; the contract is ``autotune.contract``).

``write_script_configs`` (search process) puts the emitted configs for the trial's plan into its directory;
``run_script`` (trial worker, every rank) points the contract's environment variables at them and runs the
script as ``__main__`` in the worker process, so the runner's supervision (markers, timeout, stopping,
classification) is the built-in trainer's. How the script ended becomes the rank's result:

* exits 0 and rank 0 wrote ``result.json`` through ``contract.report``  -> that result (``ok``)
* exits 0 without it                                 -> ``error: script wrote no result (see the contract)``
* ``sys.exit(n)`` with n != 0                        -> ``error: script exited with code n``
* raises                                             -> ``error`` (``oom`` for an out-of-memory error)

Torch-free: the search process imports it without torch.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from pathlib import Path

from autotune.contract import ENV, SCRIPT_CONFIGS
from autotune.plan import ParallelPlan
from autotune.specs import ClusterSpec, ModelSpec
from autotune.trials.config import TrialConfig
from autotune.trials.result import TrialResult, TrialStatus

__all__ = ["write_script_configs", "script_env", "run_script", "NO_RESULT"]

NO_RESULT = "script wrote no result (see the contract: autotune.contract.report)"


def write_script_configs(trial_dir: Path, plan: ParallelPlan, model: ModelSpec, cluster: ClusterSpec) -> None:
    """``ds_config.json`` and/or ``accelerate_fsdp.yaml`` for ``plan``, as ``autotune emit`` writes them."""
    import json

    import yaml

    from autotune.emit import (
        accelerate_unsupported,
        deepspeed_unsupported,
        to_accelerate_config,
        to_ds_config,
    )

    trial_dir.mkdir(parents=True, exist_ok=True)
    for name in SCRIPT_CONFIGS.values():
        (trial_dir / name).unlink(missing_ok=True)
    if not deepspeed_unsupported(plan) and str(plan.framework) == "deepspeed":
        text = json.dumps(to_ds_config(plan, model), indent=2) + "\n"
        (trial_dir / SCRIPT_CONFIGS["ds_config"]).write_text(text)
    if not accelerate_unsupported(plan) and str(plan.framework) == "fsdp":
        text = yaml.safe_dump(to_accelerate_config(plan, model, cluster), sort_keys=False)
        (trial_dir / SCRIPT_CONFIGS["accelerate_config"]).write_text(text)


def script_env(trial_dir: Path, config: TrialConfig) -> dict[str, str]:
    """The contract's environment variables for a trial directory (only configs that exist)."""
    env = {
        ENV["trial_dir"]: str(trial_dir),
        ENV["plan"]: str(trial_dir / "plan.json"),
        ENV["result"]: str(trial_dir / "result.json"),
        ENV["progress"]: str(trial_dir / "progress.jsonl"),
        ENV["warmup_steps"]: str(config.warmup_steps),
        ENV["measure_steps"]: str(config.measure_steps),
    }
    for key, name in SCRIPT_CONFIGS.items():
        if (trial_dir / name).exists():
            env[ENV[key]] = str(trial_dir / name)
    return env


def _exit_as(trial_dir: Path, rank: int, status: TrialStatus, error: str, code: int) -> None:
    TrialResult(status=status, error=f"rank {rank}: {error}").write(trial_dir / f"result.rank{rank}.json")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_script(trial_dir: Path, config: TrialConfig, rank: int) -> None:
    """Run ``config.script`` as ``__main__`` on this rank and exit with its outcome; never returns."""
    assert config.script is not None
    os.environ.update(script_env(trial_dir, config))
    sys.argv = [config.script]
    sys.path.insert(0, str(Path(config.script).parent))
    code = 0
    try:
        runpy.run_path(config.script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:  # noqa: BLE001 - the user's code: every failure becomes this rank's result
        traceback.print_exc()
        oom = "OutOfMemoryError" in type(e).__name__
        line = f"{type(e).__name__}: {e}".splitlines()[0][:500]
        _exit_as(trial_dir, rank, TrialStatus.OOM if oom else TrialStatus.ERROR, line, 1)
    if code:
        _exit_as(trial_dir, rank, TrialStatus.ERROR, f"script exited with code {code}", code)
    if rank == 0 and not (trial_dir / "result.json").exists():
        _exit_as(trial_dir, rank, TrialStatus.ERROR, NO_RESULT, 1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as the built-in worker: no interpreter teardown (gloo's exit-time abort)
