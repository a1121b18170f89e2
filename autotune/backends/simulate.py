"""``simulate``: the cost model's prediction stands in for a measurement (no GPU, no subprocess).

For planning without the cluster, and for tests of the search itself. ``measures`` is False, so every report
says the numbers are predicted; nothing is written to the trial directory. ``AUTOTUNE_SLOWDOWN_MS`` (a
diagnostic knob) makes each simulated step take that long in wall time; the prediction is unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from autotune.costmodel import Estimate, estimate
from autotune.errors import ConfigError
from autotune.plan import ParallelPlan
from autotune.specs import ClusterSpec, ModelSpec
from autotune.trials.config import slowdown_s
from autotune.trials.request import ReportFn, TrialRequest
from autotune.trials.result import TrialResult, TrialStatus

__all__ = ["SimulateBackend"]

Estimator = Callable[[ModelSpec, ClusterSpec, ParallelPlan], Estimate]


class SimulateBackend:
    name = "simulate"
    measures = False

    def __init__(self, estimator: Estimator = estimate) -> None:
        self._estimator = estimator

    def run(self, request: TrialRequest, report: ReportFn | None = None) -> TrialResult:
        est = self._estimator(request.model, request.cluster, request.plan)
        try:
            time.sleep(slowdown_s() * (request.warmup_steps + request.measure_steps))
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if not est.feasible:
            return TrialResult(status=TrialStatus.INFEASIBLE, error=est.reasons[0], wall_s=0.0)
        return TrialResult(
            status=TrialStatus.OK,
            tokens_per_s=est.tokens_per_s,
            step_time_s=est.step_time_s,
            step_time_cov=0.0,
            peak_memory_bytes=est.memory_bytes_per_gpu,
            mfu=est.mfu,
            wall_s=0.0,
            extra={"simulated": True},
        )
