"""The contract between your own training script and ``autotune search ... --script train.py``.

autotune launches the script under ``torchrun`` once per trial, in the trial's directory, with the plan
to measure in these environment variables (paths are absolute). The launch files of ``autotune emit``
(``best/launch_*.sh``, ``launch_slurm.sbatch``, ``pytorchjob.yaml``) set the same from ``autotune_env.sh``:

* ``AUTOTUNE_TRIAL_DIR``: the trial's directory (also the working directory)
* ``AUTOTUNE_PLAN``: ``plan.json``, the ParallelPlan (tp, pp, dp, sharding, micro_batch, global_batch,
  seq_len, recompute, offload, precision, framework, ...); ``plan()`` reads it
* ``AUTOTUNE_DS_CONFIG``: ``ds_config.json`` for ``deepspeed.initialize`` (plans DeepSpeed can express)
* ``AUTOTUNE_ACCELERATE_CONFIG``: ``accelerate_fsdp.yaml`` (plans accelerate can express)
* ``AUTOTUNE_WARMUP_STEPS``, ``AUTOTUNE_MEASURE_STEPS``: optimizer steps to run untimed, then timed
* ``AUTOTUNE_RESULT``: where ``report`` writes ``result.json``
* ``AUTOTUNE_PROGRESS``: where ``step`` appends ``progress.jsonl`` (the pruner reads it while you run)

The script applies the plan itself, trains ``warmup_steps() + measure_steps()`` steps, times each measured
step (``torch.cuda.synchronize()`` first on a GPU) and calls ``step(seconds)`` after each, then
``report(...)`` once. Only rank 0 writes (other ranks' calls do nothing), so every rank may call both. A
script that exits 0 without ``report`` is recorded as ``error: script wrote no result``; a non-zero exit as
``error`` with the tail of its stderr; one that runs past the trial timeout as ``timeout``. Example:
``examples/train_script/train.py``.

Standard library only: importing this costs nothing and needs neither torch nor optuna.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

__all__ = ["ENV", "plan", "warmup_steps", "measure_steps", "tokens_per_step", "step", "report"]

ENV = {
    "trial_dir": "AUTOTUNE_TRIAL_DIR",
    "plan": "AUTOTUNE_PLAN",
    "ds_config": "AUTOTUNE_DS_CONFIG",
    "accelerate_config": "AUTOTUNE_ACCELERATE_CONFIG",
    "warmup_steps": "AUTOTUNE_WARMUP_STEPS",
    "measure_steps": "AUTOTUNE_MEASURE_STEPS",
    "result": "AUTOTUNE_RESULT",
    "progress": "AUTOTUNE_PROGRESS",
}
"""Contract field -> environment variable."""
SCRIPT_CONFIGS = {"ds_config": "ds_config.json", "accelerate_config": "accelerate_fsdp.yaml"}
"""Contract field -> the file it points to, in the trial directory and beside ``autotune emit``'s output."""

_step_times_s: list[float] = []


def _env(key: str) -> str:
    value = os.environ.get(ENV[key])
    if not value:
        raise RuntimeError(
            f"{ENV[key]} is not set: run this script through `autotune search --script` or a "
            "launcher autotune emit wrote (bash best/launch_torchrun.sh train.py)"
        )
    return value


def _rank0() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def plan() -> dict[str, Any]:
    """The plan to measure, as ``plan.json`` holds it (``grad_accum`` added: micro-batches per step)."""
    data: dict[str, Any] = json.loads(Path(_env("plan")).read_text())
    data["grad_accum"] = data["global_batch"] // (data["dp"] * data["micro_batch"])
    return data


def warmup_steps() -> int:
    return int(os.environ.get(ENV["warmup_steps"], "2"))


def measure_steps() -> int:
    return int(os.environ.get(ENV["measure_steps"], "5"))


def tokens_per_step() -> int:
    """Global tokens per optimizer step: ``global_batch x seq_len``."""
    p = plan()
    return int(p["global_batch"]) * int(p["seq_len"])


def step(step_time_s: float, *, tokens: int | None = None) -> None:
    """Record one measured optimizer step of ``step_time_s`` seconds (``tokens``: global tokens it trained,
    default ``tokens_per_step()``). Rank 0 appends it to ``progress.jsonl`` for the pruner."""
    _step_times_s.append(float(step_time_s))
    if not _rank0():
        return
    tokens = tokens if tokens is not None else tokens_per_step()
    line = {
        "step": len(_step_times_s) - 1,
        "step_time_s": step_time_s,
        "time": time.time(),
        "tokens_per_s": tokens / step_time_s,
    }
    with Path(_env("progress")).open("a") as f:
        f.write(json.dumps(line) + "\n")


def report(
    *,
    tokens_per_s: float | None = None,
    step_time_s: float | None = None,
    peak_memory_bytes: float | None = None,
    loss: float | None = None,
    **extra: Any,
) -> None:
    """Write the trial's ``result.json`` (status ``ok``) from rank 0.

    ``step_time_s`` defaults to the median of the steps given to ``step``; ``tokens_per_s`` to
    ``tokens_per_step() / step_time_s``. ``peak_memory_bytes``: the largest rank's peak (on a GPU
    ``torch.cuda.max_memory_allocated()`` reduced with MAX). ``extra``: anything JSON-serialisable to keep.
    """
    if not _rank0():
        return
    times = list(_step_times_s)
    if step_time_s is None and times:
        step_time_s = statistics.median(times)
    if tokens_per_s is None:
        if not step_time_s:
            raise ValueError("report() needs tokens_per_s, step_time_s, or steps recorded with step()")
        tokens_per_s = tokens_per_step() / step_time_s
    cov = statistics.pstdev(times) / statistics.fmean(times) if len(times) > 1 else None
    result = {
        "status": "ok",
        "tokens_per_s": float(tokens_per_s),
        "step_time_s": step_time_s,
        "step_time_cov": cov,
        "peak_memory_bytes": peak_memory_bytes,
        "mfu": None,
        "loss": loss,
        "error": None,
        "wall_s": None,
        "extra": {"source": "script", "step_times_s": times, **extra},
    }
    path = Path(_env("result"))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(path)
