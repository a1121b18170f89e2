"""The backend interface: the search is independent of how (or whether) a trial runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from autotune.plan import ParallelPlan
from autotune.specs import ClusterSpec, ModelSpec
from autotune.trials.result import TrialResult

__all__ = ["Backend", "TrialRequest", "ReportFn"]

ReportFn = Callable[[int, float], bool]
"""``report(step, tokens_per_s) -> should_stop``: intermediate values for an Optuna pruner."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialRequest:
    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan
    trial_dir: Path
    """Own directory: plan.json, cmd.txt, stdout.log, stderr.log, result.json."""
    timeout_s: float = 600.0
    warmup_steps: int = 2
    measure_steps: int = 5


class Backend(Protocol):
    name: str
    measures: bool
    """True when results are measured (torchrun, deepspeed); False for ``simulate``."""

    def run(self, request: TrialRequest, report: ReportFn | None = None) -> TrialResult: ...
