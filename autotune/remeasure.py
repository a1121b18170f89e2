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
from autotune.trialrecord import Attr, TrialRecord, outcome_attrs, predicted_attrs, record_of
from autotune.trials.result import TrialResult, TrialStatus

__all__ = ["to_remeasure", "remeasure", "new_trials", "act"]

REMEASURE_STEPS = 10
"""Measured steps of a re-measurement (a search trial takes 5): their spread sets the noise band."""


def to_remeasure(study: Any, last: dict[str, Any] | None, k: int) -> list[Any]:
    """The incumbent (the last record's best plan, else the study's best), then the study's next K."""

    plans = [last["best"]["plan"]] if last else []
    for record in _latest_per_plan(study):
        if len(plans) >= k + 1:
            break
        if record.plan not in plans:
            plans.append(record.plan)
    return [ParallelPlan.from_dict(p) for p in plans]


def _latest_per_plan(study: Any) -> list[TrialRecord]:
    """Finished feasible trials, the latest measurement of each plan, best first."""
    from optuna.trial import TrialState

    latest: dict[str, TrialRecord] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        record = record_of(t)
        if record.is_duplicate or record.key is None or record.value is None:
            continue
        if any(v > 0 for v in t.constraints.values()):
            continue
        if record.key not in latest or latest[record.key].number < record.number:
            latest[record.key] = record
    return sorted(latest.values(), key=lambda r: r.value or 0.0, reverse=True)


def remeasure(joined: Joined, plan: Any, trial_dir: Path, date: str) -> Any:
    """Run ``plan`` again on the study's backend now; the result joins the study as a finished trial."""
    from autotune.costmodel import estimate
    from autotune.trials.request import TrialRequest

    model, cluster = joined.ranking.ctx.model, joined.ranking.ctx.cluster
    est = estimate(model, cluster, plan)
    result = joined.backend.run(
        TrialRequest(
            model=model, cluster=cluster, plan=plan, trial_dir=trial_dir, measure_steps=REMEASURE_STEPS
        )
    )
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
    attrs = {
        Attr.PLAN.value: plan.to_dict(),
        Attr.SOURCE.value: "retune",
        "retune": tag,
        Attr.PREDICTED.value: predicted_attrs(est),
        **outcome_attrs(result, measured=joined.backend.measures),
    }
    constraints = {
        "plan_rule_violations": 0.0,
        "memory_excess_bytes": est.memory_bytes_per_gpu - est.memory_capacity_bytes,
        "host_memory_excess_bytes": est.memory.host_bytes_per_node
        - joined.ranking.ctx.cluster.host_memory_bytes_per_node,
        "trial_failed": 0.0 if ok else 1.0,
    }
    joined.study.add_trial(
        create_trial(
            state=TrialState.COMPLETE if ok else TrialState.FAIL,
            value=result.tokens_per_s if ok else None,
            params=params,
            distributions={k: CategoricalDistribution(list(choices[k])) for k in params},
            user_attrs=attrs,
            constraints=constraints,
        )
    )
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
            joined.study.enqueue_trial(
                params, user_attrs={Attr.SOURCE.value: "history", "date": rec["date"]}, skip_if_exists=True
            )


def new_trials(
    joined: Joined,
    history: list[dict[str, Any]],
    k: int,
    n_trials: int | None,
    budget_s: float | None,
    start: float,
    *,
    log: Callable[[str], None] | None = None,
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
    launched = run_study(
        joined.study,
        joined.ranking,
        joined.backend,
        StudyOptions(n_trials=n, timeout_s=remaining, top_k=k),
        trials_dir=joined.study_dir.trials,
        log=log,
    )
    new = [
        r
        for r in map(record_of, joined.study.get_trials(deepcopy=False))
        if r.number > before and r.value is not None and r.status == TrialStatus.OK and not r.is_duplicate
    ]
    return launched, [_from_trial(joined, r) for r in new]


def _from_trial(joined: Joined, record: TrialRecord) -> Any:
    path = joined.study_dir.trials / f"{record.number:05d}" / "result.json"
    if path.exists():  # this host ran it: the per-step times give its noise
        result = TrialResult.read(path)
    else:
        result = TrialResult(
            status=TrialStatus.OK,
            tokens_per_s=record.value,
            extra={"simulated": True},
            step_time_cov=record.measured.get("step_time_cov", 0.0),
        )
    plan = record.parallel_plan
    assert plan is not None  # OK trials were launched with their plan stored
    return measurement(plan, result, record.predicted.get("tokens_per_s"), record.number)


def act(joined: Joined, kind: str, best: Any) -> list[Path]:
    """An improvement (or a first record without launch files) writes best/; the old go to best.prev/."""
    from autotune.costmodel import estimate
    from autotune.retune import promote

    if kind != "improvement" and not (kind == "baseline" and not joined.study_dir.best.exists()):
        return []
    plan = ParallelPlan.from_dict(best.plan)
    model, cluster = joined.ranking.ctx.model, joined.ranking.ctx.cluster
    return promote(joined.study_dir.best, plan, model, cluster, estimate(model, cluster, plan))
