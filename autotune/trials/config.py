"""The trial directory layout and ``trial.json``: what the runner tells the worker beyond the plan.

Torch-free, so the search process can write trials without importing torch.

Layout of one trial directory (``runs/<study>/<trial>/``)::

    plan.json              ParallelPlan.to_dict()              (runner)
    trial.json             TrialConfig: model shape, steps...  (runner)
    cmd.txt                the launch command, shell-quoted    (runner)
    stdout.log stderr.log  torchrun's and the workers' output  (runner)
    started.<rank>         a worker process began (pid inside) (worker, before the process group)
    joined.<rank>          init_process_group returned         (worker)
    progress.jsonl         one line per measured step          (worker rank 0)
    result.rank<r>.json    a rank's own failure                (worker)
    result.json            the TrialResult                     (worker rank 0, then the runner)
    ds_config.json, accelerate_fsdp.yaml   the plan's configs for ``--script`` (trials/script.py)
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from autotune.specs import ModelSpec

__all__ = [
    "TrialConfig",
    "FAULT_ENV",
    "FAULT_RANK_ENV",
    "FAULT_STEP_ENV",
    "FAULTS",
    "SLOWDOWN_ENV",
    "slowdown_s",
]

FAULT_ENV = "AUTOTUNE_FAULT"
"""Test-only fault injection in the worker: one of ``FAULTS``."""
FAULT_RANK_ENV = "AUTOTUNE_FAULT_RANK"
"""Rank that faults (default: the last rank)."""
FAULT_STEP_ENV = "AUTOTUNE_FAULT_STEP"
"""Step (counting warm-up) before which the fault fires (default 1)."""
FAULTS = ("crash", "hang", "oom", "exit")
SLOWDOWN_ENV = "AUTOTUNE_SLOWDOWN_MS"
"""Diagnostic knob, unset in production: milliseconds of sleep added to every training step, inside the timed
region (the worker), so a measurement really gets slower; the ``simulate`` backend sleeps as long per step
but its predicted tokens/s never change. Tests use it to make trials take time and to inject a regression
that ``autotune retune`` must catch; ``autotune retune`` records it with the environment."""


def slowdown_s() -> float:
    """``AUTOTUNE_SLOWDOWN_MS`` in seconds (0 when unset)."""
    text = os.environ.get(SLOWDOWN_ENV, "").strip()
    try:
        value = float(text) if text else 0.0
    except ValueError:
        raise ValueError(f"{SLOWDOWN_ENV}={text!r}: expected milliseconds (a number >= 0)") from None
    if value < 0:
        raise ValueError(f"{SLOWDOWN_ENV}={text!r}: expected milliseconds (a number >= 0)")
    return value / 1000.0


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialConfig:
    """Everything the worker needs besides the plan; written to ``trial.json``."""

    model: ModelSpec
    warmup_steps: int = 2
    """Steps run before timing starts (allocator warm-up, optimizer-state creation, autotuning)."""
    measure_steps: int = 5
    seed: int = 0
    """Weights and data: the same seed gives the same weights and batches in every layout."""
    lr: float = 1e-3
    device: str = "auto"
    """``auto`` (CUDA when present, else CPU), ``cuda`` or ``cpu``."""
    peak_flops_per_gpu: float | None = None
    """Dense peak of the catalog GPU at the trial's precision, for MFU (None: MFU not reported)."""
    fsdp_at_dp1: bool = False
    """Validation only: wrap with ``fully_shard`` at DP=1 (a plan cannot say this)."""
    full_init: bool = True
    """Build and initialise the whole model on every rank before sharding (identical weights in
    every layout). False: build on ``meta``, shard, then initialise (models too big for one device)."""
    workload: str | None = None
    """``pkg.module:build``: the user's model and batches (``autotune.workload``) instead of the built-in."""
    workload_root: str | None = None
    """``sys.path`` entry that imports ``workload`` (the search resolved it; workers start elsewhere)."""
    script: str | None = None
    """Absolute path of the user's training script, run on every rank instead of autotune's trainer; it
    reports through ``autotune.contract``."""

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["model"] = asdict(self.model)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialConfig:
        data = dict(data)
        data["model"] = ModelSpec(**data["model"])
        return cls(**data)

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def read(cls, path: Path) -> TrialConfig:
        return cls.from_dict(json.loads(path.read_text()))
