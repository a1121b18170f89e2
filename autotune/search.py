"""The search: an Optuna study measures the promising plans of the cost model's ranking (``ranking.py``).

``run_study`` enqueues the cost model's top-K, the best plan of each layout first (``opening_plans``),
then asks and tells. Multivariate TPE (seeded) proposes; ``_gate`` judges every proposal with the cost
model before anything runs. An infeasible proposal never launches: its reason goes to ``user_attrs`` and
its violation (e.g. excess bytes) to the sampler through ``trial.set_constraint`` (feasible iff <= 0), and
the trial is told PRUNED. The objective is tokens/s: measured on real backends, predicted on ``simulate``;
the study maximises it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.backends.base import Backend
from autotune.costmodel import Estimate, estimate
from autotune.headroom import headroom_excess_bytes, headroom_reason
from autotune.interrupt import held
from autotune.plan import ParallelPlan
from autotune.ranking import Estimator, Ranking
from autotune.render import plan_summary
from autotune.resume import INTERRUPTED, ask_first, first_trials, interrupted, repair, trial_dir_of
from autotune.scaleout import beat, fail_stale, keep_alive
from autotune.space import PlanContext, params_of, suggest_plan
from autotune.trialrecord import Attr, TrialRecord, outcome_attrs, plan_key, predicted_attrs, record_of
from autotune.trials.request import TrialRequest
from autotune.trials.result import TrialResult, TrialStatus

__all__ = ["StudyOptions", "make_sampler", "opening_plans", "run_study", "top_trials"]

_CONSTRAINTS = ("plan_rule_violations", "memory_excess_bytes", "host_memory_excess_bytes")


@dataclass(frozen=True, kw_only=True, slots=True)
class StudyOptions:
    n_trials: int
    """Trials to launch (measure, or simulate) in this run; infeasible proposals do not count."""
    timeout_s: float | None = None
    top_k: int = 5
    trial_timeout_s: float = 600.0


def make_sampler(seed: int, num_existing_trials: int = 0) -> optuna.samplers.BaseSampler:
    """Multivariate TPE; a resumed study gets a fresh seed so it does not replay its random start."""
    return optuna.samplers.TPESampler(seed=seed + num_existing_trials, multivariate=True, constant_liar=True)


def run_study(
    study: optuna.Study,
    ranking: Ranking,
    backend: Backend,
    options: StudyOptions,
    *,
    trials_dir: Path,
    estimator: Estimator = estimate,
    log: Callable[[str], None] | None = None,
    refine: Callable[[optuna.Study], list[dict[str, Any]]] | None = None,
) -> int:
    """Enqueue the top-K, then ask/tell until ``n_trials`` have launched, every feasible plan has run, or the
    timeout passes. Returns the number launched.

    ``refine`` (``autotune.calibrate.Refiner``): after every launched trial the plans it returns are enqueued
    next -- the cost model, recalibrated on what was measured, picks the next plan; TPE proposes when it has
    none. With it only the cost model's best plan is enqueued up front."""
    top_k = options.top_k if refine is None else min(options.top_k, 1)
    for opening in opening_plans(ranking.feasible, top_k):
        rank = ranking.feasible.index(opening) + 1
        study.enqueue_trial(
            params_of(opening.plan),
            skip_if_exists=True,
            user_attrs={Attr.SOURCE.value: "cost model", "predicted_rank": rank},
        )
    deadline = time.monotonic() + options.timeout_s if options.timeout_s else None
    repair(study, trials_dir, backend.measures, _record, log)  # what a killed search left: ended, kept
    first = first_trials(study)  # the plans that were running when a search stopped: they run first
    tried = {
        key
        for r in map(record_of, study.get_trials(deepcopy=False))
        if _was_launched(r) and (key := r.key) is not None
    }
    launched = asks = repeats = 0
    while launched < options.n_trials and asks < 20 * options.n_trials + options.top_k + 50:
        if len(tried) >= len(ranking.feasible) or (deadline is not None and time.monotonic() > deadline):
            break
        fail_stale(study)  # a dead worker's RUNNING trial: failed, its plan queued again (heartbeats)
        trial, asks = ask_first(study, first), asks + 1
        try:
            beat(study, trial)  # from now on a dead process's trial is found stale
            with held():  # a stop signal waits for the whole plan: a retry must not get a part of one
                plan, reason = suggest_plan(trial, ranking.choices, ranking.ctx)
            est = _gate(study, trial, plan, reason, ranking.ctx, estimator)
            if est is None or plan is None:
                continue
            if _reuse_finished(study, trial, est.plan):
                repeats += 1
                if repeats >= _MAX_REPEATS:  # TPE keeps proposing what ran (small spaces): ranking goes on
                    _enqueue_next_untried(study, ranking, tried)
                    repeats = 0
                continue
            repeats = 0
            request = TrialRequest(
                model=ranking.ctx.model,
                cluster=ranking.ctx.cluster,
                plan=plan,
                trial_dir=trial_dir_of(trials_dir, trial.number),
                timeout_s=options.trial_timeout_s,
            )
            with keep_alive(study, trial):
                result = backend.run(request, _reporter(trial))
        except KeyboardInterrupt as e:  # a stop signal (autotune.interrupt): its processes are ended by now
            hint = interrupted(
                study, trial, trial_dir_of(trials_dir, trial.number), backend.measures, _record
            )
            e.resume_hint = hint  # type: ignore[attr-defined]
            raise
        launched += 1
        tried.add(plan_key(est.plan))
        try:
            _record(study, trial, result, backend.measures)
        except optuna.exceptions.UpdateFinishedTrialError:  # its heartbeat came late: another worker failed
            if log:  # it as stale and queued its plan again
                log(f"trial {trial.number}: failed as stale by another worker meanwhile; its plan runs again")
            continue
        for params in refine(study) if refine is not None else ():
            study.enqueue_trial(
                params, user_attrs={Attr.SOURCE.value: "calibrated cost model"}, skip_if_exists=True
            )
        if log:
            log(_progress_line(trial.number, plan, result))
    return launched


def opening_plans(feasible: list[Estimate], k: int) -> list[Estimate]:
    """The ``k`` plans measured first: the best predicted plan of each layout (TP, PP, DP, CP degrees), best
    layout first, then the next best predicted plans. The cost model errs most between layouts (their
    collectives differ: an uncalibrated CPU model put DP plans 3x too fast against pipeline plans,
    benchmarks/results/fidelity.json) and least between plans of one layout (micro-batch, sharding and
    schedule share its collectives), so the first trials measure the layouts and TPE refines within them."""
    seen: set[tuple[int, int, int, int]] = set()
    heads: list[Estimate] = []
    rest: list[Estimate] = []
    for est in feasible:
        layout = (est.plan.tp, est.plan.pp, est.plan.dp, est.plan.cp)
        (rest if layout in seen else heads).append(est)
        seen.add(layout)
    return (heads + rest)[:k]


_MAX_REPEATS = 3
"""Proposals in a row of plans already run before the cost model's best untried plan is enqueued."""


def _enqueue_next_untried(study: optuna.Study, ranking: Ranking, tried: set[str]) -> None:
    est = next((e for e in ranking.feasible if plan_key(e.plan) not in tried), None)
    if est is not None:
        study.enqueue_trial(
            params_of(est.plan), user_attrs={Attr.SOURCE.value: "cost model (sampler repeated)"}
        )


def _was_launched(record: TrialRecord) -> bool:
    status = TrialStatus.INFEASIBLE.value if record.status is None else record.status
    return status not in (TrialStatus.INFEASIBLE, INTERRUPTED) and not record.is_duplicate


def _gate(
    study: optuna.Study,
    trial: optuna.Trial,
    plan: ParallelPlan | None,
    reason: str | None,
    ctx: PlanContext,
    estimator: Estimator,
) -> Estimate | None:
    """The one place a proposal is judged before it may launch; returns its estimate when feasible.

    Every proposal gets the same constraints, so the sampler learns where the boundary is:
    ``plan_rule_violations`` (an illegal combination, or a reason the cost model gives beyond memory),
    ``memory_excess_bytes`` (predicted need minus the headroom budget, ``autotune/headroom.py``) and
    ``host_memory_excess_bytes`` (minus host capacity); <= 0 fits.
    An illegal or infeasible proposal is recorded with its reason and told PRUNED: it never launches.
    """
    est = estimator(ctx.model, ctx.cluster, plan) if plan is not None else None
    memory = host = 0.0
    other = 1.0 if plan is None else 0.0
    above = None
    if est is not None:
        memory = headroom_excess_bytes(est, ctx.memory_headroom)
        host = est.memory.host_bytes_per_node - ctx.cluster.host_memory_bytes_per_node
        other = float(sum(not r.startswith(("out of memory", "out of host memory")) for r in est.reasons))
        above = headroom_reason(est, ctx.memory_headroom) if est.feasible else None
        trial.set_user_attr(Attr.PLAN.value, est.plan.to_dict())
        trial.set_user_attr(Attr.PREDICTED.value, predicted_attrs(est))
    for name, value in zip(_CONSTRAINTS, (other, memory, host), strict=True):
        trial.set_constraint(name, value)
    if est is not None and est.feasible and above is None:
        return est
    trial.set_user_attr(Attr.STATUS.value, str(TrialStatus.INFEASIBLE))
    trial.set_user_attr(Attr.REASON.value, reason or above or est.reasons[0])  # type: ignore[union-attr]
    study.tell(trial, state=TrialState.PRUNED)
    return None


def _reuse_finished(study: optuna.Study, trial: optuna.Trial, plan: ParallelPlan) -> bool:
    """A plan already run in this study is not run again: its outcome is told once more."""
    key = plan_key(plan)
    for old in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        record = record_of(old)
        if old.number == trial.number or record.status == TrialStatus.INFEASIBLE or record.key != key:
            continue
        trial.set_user_attr(Attr.DUPLICATE_OF.value, old.number)
        for attr in (Attr.STATUS, Attr.MEASURED, Attr.ERROR, Attr.VALUE_SOURCE):
            if attr.value in old.user_attrs:
                trial.set_user_attr(attr.value, old.user_attrs[attr.value])
        trial.set_constraint("trial_failed", 0.0 if old.state is TrialState.COMPLETE else 1.0)
        study.tell(
            trial,
            old.value if old.state is TrialState.COMPLETE else None,
            state=None if old.state is TrialState.COMPLETE else TrialState.PRUNED,
        )
        return True
    return False


def _reporter(trial: optuna.Trial) -> Callable[[int, float], bool]:
    def report(step: int, tokens_per_s: float) -> bool:
        trial.report(tokens_per_s, step)
        return trial.should_prune()

    return report


def _record(study: optuna.Study, trial: optuna.Trial, result: TrialResult, measured: bool) -> None:
    for name, value in outcome_attrs(result, measured=measured).items():
        trial.set_user_attr(name, value)
    if result.ok and result.tokens_per_s:
        trial.set_constraint("trial_failed", 0.0)
        study.tell(trial, result.tokens_per_s)
    elif result.status is TrialStatus.PRUNED:
        study.tell(trial, state=TrialState.PRUNED)
    else:  # oom, timeout, error: a constraint, so the sampler steers away
        trial.set_constraint("trial_failed", 1.0)
        study.tell(trial, state=TrialState.PRUNED)


def _progress_line(number: int, plan: ParallelPlan, result: TrialResult) -> str:
    value = f"{result.tokens_per_s:,.0f} tokens/s" if result.tokens_per_s else (result.error or "")
    return f"trial {number}: {plan_summary(plan)} -> {result.status}: {value}"


def top_trials(study: optuna.Study, k: int) -> list[FrozenTrial]:
    """Feasible finished trials, best value first (duplicates of one plan shown once)."""
    done = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if not record_of(t).is_duplicate and all(v <= 0 for v in t.constraints.values())
    ]
    return sorted(done, key=lambda t: t.value, reverse=True)[:k]  # type: ignore[arg-type, return-value]
