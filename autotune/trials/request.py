"""What the search hands a trial: ``TrialRequest`` and the ``ReportFn`` it reports progress through.

Neutral: the search, the backends, the executors and the trial runner all import it, and it imports only
the specs and the plan, so that none of them imports another's package to name a trial.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from autotune.plan import ParallelPlan
from autotune.specs import ClusterSpec, ModelSpec

__all__ = ["TrialRequest", "ReportFn"]

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
