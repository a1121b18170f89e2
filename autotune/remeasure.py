"""The trials of ``autotune retune``: re-measure plans in a study, warm-start it from the history, run new
trials within a budget, and promote a better plan to ``best/``. The verdict and the history are
``autotune.retune``'s; the command (``autotune.cli.retune``) parses, calls these and prints.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.join import Joined
from autotune.plan import ParallelPlan
from autotune.retune import measurement

__all__ = ["to_remeasure", "remeasure", "new_trials", "act"]

REMEASURE_STEPS = 10
"""Measured steps of a re-measurement (a search trial takes 5): their spread sets the noise band."""
_MEASURED = ("tokens_per_s", "step_time_s", "step_time_cov", "peak_memory_bytes", "mfu", "wall_s")


def to_remeasure(study: Any, last: dict[str, Any] | None, k: int) -> list[Any]:
    """The incumbent (the last record's best plan, else the study's best), then the study's next K."""

    plans = [last["best"]["plan"]] if last else []
    for trial in _latest_per_plan(study):
        if len(plans) >= k + 1:
            break
        if trial.user_attrs["plan"] not in plans:
            plans.append(trial.user_attrs["plan"])
    return [ParallelPlan.from_dict(p) for p in plans]


def _latest_per_plan(study: Any) -> list[Any]:
    """Finished feasible trials, the latest measurement of each plan, best first."""
    from optuna.trial import TrialState

    latest: dict[Any, Any] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if "duplicate_of" in t.user_attrs or "plan" not in t.user_attrs or t.value is None:
            continue
        if any(v > 0 for v in t.constraints.values()):
            continue
        key = tuple(sorted(t.params.items()))
        if key not in latest or latest[key].number < t.number:
            latest[key] = t
    return sorted(latest.values(), key=lambda t: t.value, reverse=True)


def remeasure(joined: Joined, plan: Any, trial_dir: Path, date: str) -> Any:
    """Run ``plan`` again on the study's backend now; the result joins the study as a finished trial."""
    from autotune.costmodel import estimate
    from autotune.trials.request import TrialRequest

    model, cluster = joined.ranking.ctx.model, joined.ranking.ctx.cluster
    est = estimate(model, cluster, plan)
    result = joined.backend.run(TrialRequest(model=model, cluster=cluster, plan=plan, trial_dir=trial_dir,
                                             measure_steps=REMEASURE_STEPS))
    number = _add_to_study(joined, plan, est, result, f"{date} {trial_dir.name}")
    return measurement(plan, result, est.tokens_per_s, number)


def _add_to_study(joined: Joined, plan: Any, est: Any, result: Any, tag: str) -> int | None:
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    from autotune.space import params_of

    choices, params = joined.ranking.choices, params_of(plan)
    if any(params[k] not in choices[k] for k in params):  # a plan from the history outside today's space
        return None
    ok = result.ok and bool(result.tokens_per_s)
    attrs = {"plan": plan.to_dict(), "source": "retune", "retune": tag, "status": str(result.status),
             "value_source": "measured" if joined.backend.measures else "predicted",
             "predicted": {"tokens_per_s": est.tokens_per_s, "mfu": est.mfu, "step_time_s": est.step_time_s,
                           "memory_bytes_per_gpu": est.memory_bytes_per_gpu, "bottleneck": est.bottleneck,
                           "memory_capacity_bytes": est.memory_capacity_bytes}}
    if joined.backend.measures:
        attrs["measured"] = {k: v for k, v in result.to_dict().items() if v is not None and k in _MEASURED}
    if result.error:
        attrs["error"] = result.error
    constraints = {"plan_rule_violations": 0.0,
                   "memory_excess_bytes": est.memory_bytes_per_gpu - est.memory_capacity_bytes,
                   "host_memory_excess_bytes": est.memory.host_bytes_per_node -
                   joined.ranking.ctx.cluster.host_memory_bytes_per_node,
                   "trial_failed": 0.0 if ok else 1.0}
    joined.study.add_trial(create_trial(
        state=TrialState.COMPLETE if ok else TrialState.FAIL, value=result.tokens_per_s if ok else None,
        params=params, distributions={k: CategoricalDistribution(list(choices[k])) for k in params},
        user_attrs=attrs, constraints=constraints))
    mine = (t for t in reversed(joined.study.get_trials(deepcopy=False)) if t.user_attrs.get("retune") == tag)
    return int(next(mine).number)


def _warm_start(joined: Joined, history: list[dict[str, Any]], k: int) -> None:
    """Queue the best plans of the history (no-ops for plans this study has already run)."""
    from autotune.space import params_of

    seen: list[dict[str, Any]] = []
    for rec in reversed(history):
        plan = rec["best"]["plan"]
        if plan in seen or len(seen) > k:
            continue
        seen.append(plan)
        params = params_of(ParallelPlan.from_dict(plan))
        if all(params[knob] in joined.ranking.choices[knob] for knob in params):
            joined.study.enqueue_trial(params, user_attrs={"source": "history", "date": rec["date"]},
                                       skip_if_exists=True)


def new_trials(joined: Joined, history: list[dict[str, Any]], k: int, n_trials: int | None,
               budget_s: float | None, start: float, *, log: Callable[[str], None] | None = None
               ) -> tuple[int, list[Any]]:
    """Queue the history's best plans and the cost model's top-K not yet run (a warm start), then run new
    trials within the budget; their measurements."""
    from autotune.search import StudyOptions, run_study

    before = max((t.number for t in joined.study.get_trials(deepcopy=False)), default=-1)
    remaining = None if budget_s is None else budget_s - (time.monotonic() - start)
    n = n_trials if n_trials is not None else len(joined.ranking.feasible)
    if n == 0 or (remaining is not None and remaining <= 0):
        return 0, []
    _warm_start(joined, history, k)
    launched = run_study(joined.study, joined.ranking, joined.backend,
                         StudyOptions(n_trials=n, timeout_s=remaining, top_k=k),
                         trials_dir=joined.study_dir.trials, log=log)
    new = [t for t in joined.study.get_trials(deepcopy=False) if t.number > before and t.value is not None
           and t.user_attrs.get("status") == "ok" and "duplicate_of" not in t.user_attrs]
    return launched, [_from_trial(joined, t) for t in new]


def _from_trial(joined: Joined, trial: Any) -> Any:
    from autotune.trials.result import TrialResult, TrialStatus

    path = joined.study_dir.trials / f"{trial.number:05d}" / "result.json"
    if path.exists():  # this host ran it: the per-step times give its noise
        result = TrialResult.read(path)
    else:
        measured = trial.user_attrs.get("measured", {})
        result = TrialResult(status=TrialStatus.OK, tokens_per_s=trial.value,
                             step_time_cov=measured.get("step_time_cov", 0.0), extra={"simulated": True})
    predicted = trial.user_attrs.get("predicted", {}).get("tokens_per_s")
    return measurement(ParallelPlan.from_dict(trial.user_attrs["plan"]), result, predicted, trial.number)


def act(joined: Joined, kind: str, best: Any) -> list[Path]:
    """An improvement (or a first record without launch files) writes best/; the old go to best.prev/."""
    from autotune.costmodel import estimate
    from autotune.retune import promote

    if kind != "improvement" and not (kind == "baseline" and not joined.study_dir.best.exists()):
        return []
    plan = ParallelPlan.from_dict(best.plan)
    model, cluster = joined.ranking.ctx.model, joined.ranking.ctx.cluster
    return promote(joined.study_dir.best, plan, model, cluster, estimate(model, cluster, plan))
