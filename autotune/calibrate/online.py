"""Calibrate during the search: after every measured trial, refit and propose the best plan not yet tried.

``Refiner(ranking)`` is the ``refine`` hook of ``search.run_study``. Until ``MIN_TRIALS`` plans are measured
it proposes the cost model's ranking in order (the top-K of a search without it); from then on it fits
``fit.Factors`` to everything measured so far (``overheads=False``: the three efficiency factors and, when the
AIC asks, the latency scale -- a second or so) and proposes the plan the calibrated model predicts fastest
among those not yet launched. Fits are cached by the set of measurements, so replays that reach the same
state do not refit. Plans that failed count as tried.
"""

from __future__ import annotations

import json
from typing import Any

from autotune.calibrate.fit import Factors, Observation, fit, predict_s
from autotune.calibrate.study import MIN_TRIALS, observations
from autotune.plan import ParallelPlan
from autotune.space import params_of
from autotune.trialrecord import plan_key, record_of

__all__ = ["Refiner"]


def _params_key(params: dict[str, Any]) -> str:
    """``plan_key`` of the plan these trial parameters make (they are ``params_of`` it)."""
    return json.dumps(params, sort_keys=True, default=str)


def _tried_key(trial: Any) -> str:
    """The plan a trial ran or will run: its judged plan (collapsed knobs normalised), else the params it was
    enqueued with."""
    key = record_of(trial).key
    return key if key is not None else _params_key(trial.system_attrs.get("fixed_params", trial.params))


class Refiner:
    """``refine(study) -> [params]``: the next plan to enqueue (empty when every feasible plan was tried)."""

    def __init__(self, ranking: Any, *, min_trials: int = MIN_TRIALS) -> None:
        self.ranking = ranking
        self.min_trials = min_trials
        self._fits: dict[frozenset[tuple[str, float]], Factors] = {}

    def factors(self, obs: list[Observation]) -> Factors | None:
        """The fit to ``obs`` (cached), or None below ``min_trials`` measurements."""
        if len(obs) < self.min_trials:
            return None
        state = frozenset((plan_key(o.plan), o.measured_s) for o in obs)
        if state not in self._fits:
            ctx = self.ranking.ctx
            self._fits[state] = fit(ctx.model, ctx.cluster, obs, overheads=False).factors
        return self._fits[state]

    def order(self, obs: list[Observation]) -> list[ParallelPlan]:
        """Feasible plans, best first: by the calibrated model once it can be fitted, else as ranked."""
        plans = [e.plan for e in self.ranking.feasible]
        factors = self.factors(obs)
        if factors is None:
            return plans
        ctx = self.ranking.ctx
        cluster = factors.apply(ctx.cluster)
        return sorted(plans, key=lambda p: predict_s(ctx.model, cluster, p))

    def __call__(self, study: Any) -> list[dict[str, Any]]:
        tried = {_tried_key(t) for t in study.get_trials(deepcopy=False)}
        for plan in self.order(observations(study)):
            params = params_of(plan)
            if _params_key(params) not in tried:
                return [params]
        return []
