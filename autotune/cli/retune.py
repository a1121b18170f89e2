"""``autotune retune``: re-measure a study's best plans, search a little more, and say what changed.

Examples (``launchers/`` runs it nightly from cron, systemd, a Kubernetes CronJob or Slurm scrontab)::

    autotune retune --study 70b-16xh100-sxm --storage postgresql+psycopg2://autotune@db/autotune --budget 30m
    autotune retune --study s1 --budget 4 --threshold 0.05 --top 3

Each run re-measures the incumbent (the last record's best plan) and the study's top-K on the study's own
backend, queues the best plans of the history (a warm start for Optuna), runs new trials within
``--budget``, and appends one record to ``runs/<study>/history.jsonl`` (``autotune.retune``).

Exit codes: 0 stable, first record, or improvement (new launch files in ``best/``, the previous ones in
``best.prev/``, and the plan diff printed); 3 regression: the last best plan is slower beyond its measured
noise by more than ``--threshold``, or fails, with the suspected cause -- a suspected regression is measured
once more first and the better measurement counts, so one busy moment on the node is not an alarm;
1 nothing could be measured; 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from autotune.cli.worker import Joined, add_study_args, join_study
from autotune.plan import ParallelPlan

__all__ = ["RetuneCommand"]

_REGRESSION = 3
_REMEASURE_STEPS = 10
"""Measured steps of a re-measurement (a search trial takes 5): their spread sets the noise band."""
_MEASURED = ("tokens_per_s", "step_time_s", "step_time_cov", "peak_memory_bytes", "mfu", "wall_s")


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1), got {text!r}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {text!r}")
    return value


class RetuneCommand:
    help = "Re-measure a study's best plans, try new ones within a budget, and flag regressions (exit 3)."

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        add_study_args(p)
        g = p.add_argument_group("retune")
        g.add_argument("--budget", default="4", help="new trials: a count (4, the default) or a wall-clock "
                       "budget for the whole run (90s, 30m, 2h)")
        g.add_argument("--threshold", type=_fraction, default=0.05, help="a slowdown beyond the measured "
                       "noise larger than this fraction is a regression (default 0.05)")
        g.add_argument("--top", type=_count, default=3, metavar="K",
                       help="plans re-measured besides the incumbent (default 3)")
        g.add_argument("--json", action="store_true", help="print the history record")

    def run(self, args: argparse.Namespace) -> int:
        from autotune.retune import (
            append_history,
            compare,
            environment,
            parse_budget,
            read_history,
            record_of,
        )

        n_trials, budget_s = parse_budget(args.budget)
        start = time.monotonic()
        joined = join_study(args.study, args.storage, Path(args.out), heartbeat_s=args.heartbeat)
        history_path = joined.study_dir.root / "history.jsonl"
        history = read_history(history_path)
        last = history[-1] if history else None
        date = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        env = environment()
        run_dir = joined.study_dir.root / "retune" / date.replace(":", "")
        plans = _to_remeasure(joined.study, last, args.top)
        remeasured = [_remeasure(joined, plan, run_dir / f"{i:02d}", date) for i, plan in enumerate(plans)]
        launched, new = _new_trials(joined, history, args.top, n_trials, budget_s, start)
        incumbent = remeasured[0] if remeasured else None
        measured = [m for m in remeasured + new if m.ok]
        best = max(measured, key=lambda m: m.tokens_per_s) if measured else incumbent
        if best is None or (last is None and not best.ok):
            print(f"autotune retune: nothing measured in study '{args.study}' (no finished trial to "
                  f"re-measure, no new trial succeeded); see {run_dir}, {joined.study_dir.trials}",
                  file=sys.stderr)
            return 1
        verdict = compare(last, incumbent, best, env, args.threshold)
        if verdict.kind == "regression" and incumbent is not None:  # rule out a transient (a busy node)
            again = _remeasure(joined, ParallelPlan.from_dict(incumbent.plan), run_dir / "00-confirm", date)
            remeasured.append(again)
            incumbent = max((incumbent, again), key=lambda m: (m.ok, m.tokens_per_s or 0.0))
            ok = [m for m in remeasured + new if m.ok] or [incumbent]
            best = max(ok, key=lambda m: m.tokens_per_s or 0.0)
            verdict = compare(last, incumbent, best, env, args.threshold)
        emitted = _act(joined, verdict.kind, best)
        record = record_of(date=date, study=args.study, backend=joined.setup["backend"], environment=env,
                           threshold=args.threshold, budget=args.budget, best=best, incumbent=incumbent,
                           remeasured=remeasured, new_trials=launched, verdict=verdict.kind,
                           change=verdict.change, noise_band=verdict.noise_band, cause=verdict.cause,
                           message=verdict.message)
        append_history(history_path, record)
        if args.json:
            print(json.dumps(record, indent=2))
        else:
            print(_report(record, last, emitted, history_path, len(history) + 1))
        if verdict.kind == "regression":
            print(f"autotune retune: REGRESSION in study '{args.study}': {verdict.message}; suspected cause: "
                  f"{verdict.cause}", file=sys.stderr)
            return _REGRESSION
        return 0


def _to_remeasure(study: Any, last: dict[str, Any] | None, k: int) -> list[Any]:
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


def _remeasure(joined: Joined, plan: Any, trial_dir: Path, date: str) -> Any:
    """Run ``plan`` again on the study's backend now; the result joins the study as a finished trial."""
    from autotune.backends.base import TrialRequest
    from autotune.costmodel import estimate
    from autotune.retune import measurement

    model, cluster = joined.ranking.ctx.model, joined.ranking.ctx.cluster
    est = estimate(model, cluster, plan)
    result = joined.backend.run(TrialRequest(model=model, cluster=cluster, plan=plan, trial_dir=trial_dir,
                                             measure_steps=_REMEASURE_STEPS))
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


def _new_trials(joined: Joined, history: list[dict[str, Any]], k: int, n_trials: int | None,
                budget_s: float | None, start: float) -> tuple[int, list[Any]]:
    """Queue the history's best plans and the cost model's top-K not yet run (a warm start), then run new
    trials within the budget; their measurements."""
    from autotune.search import StudyOptions, run_study

    before = max((t.number for t in joined.study.get_trials(deepcopy=False)), default=-1)
    remaining = None if budget_s is None else budget_s - (time.monotonic() - start)
    n = n_trials if n_trials is not None else len(joined.ranking.feasible)
    if n == 0 or (remaining is not None and remaining <= 0):
        return 0, []
    _warm_start(joined, history, k)
    log = lambda line: print(line, file=sys.stderr)  # noqa: E731
    launched = run_study(joined.study, joined.ranking, joined.backend,
                         StudyOptions(n_trials=n, timeout_s=remaining, top_k=k),
                         trials_dir=joined.study_dir.trials, log=log)
    new = [t for t in joined.study.get_trials(deepcopy=False) if t.number > before and t.value is not None
           and t.user_attrs.get("status") == "ok" and "duplicate_of" not in t.user_attrs]
    return launched, [_from_trial(joined, t) for t in new]


def _from_trial(joined: Joined, trial: Any) -> Any:
    from autotune.retune import measurement
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


def _act(joined: Joined, kind: str, best: Any) -> list[Path]:
    """An improvement (or a first record without launch files) writes best/; the old go to best.prev/."""
    from autotune.costmodel import estimate
    from autotune.retune import promote

    if kind != "improvement" and not (kind == "baseline" and not joined.study_dir.best.exists()):
        return []
    plan = ParallelPlan.from_dict(best.plan)
    model, cluster = joined.ranking.ctx.model, joined.ranking.ctx.cluster
    return promote(joined.study_dir.best, plan, model, cluster, estimate(model, cluster, plan))


def _report(record: dict[str, Any], last: dict[str, Any] | None, emitted: list[Path], history: Path,
            num_records: int) -> str:
    from autotune.retune import plan_diff

    best, env = record["best"], record["environment"]
    lines = [f"retune    {record['study']} at {record['date']} on {env['hostname']} ({record['backend']}; "
             f"{env['gpu_count']} x {env['gpu_name']})",
             f"measured  {len(record['remeasured'])} plan(s) again, {record['new_trials']} new trial(s)"]
    lines += [f"  {m['summary']}: " + (f"{m['tokens_per_s']:,.0f} tokens/s, noise {m['noise_cov']:.1%}"
                                       if m["status"] == "ok" else f"{m['status']}: {m['error']}")
              for m in record["remeasured"]]
    how = "predicted (simulate)" if record["backend"] == "simulate" else "measured"
    lines.append(f"best      {best['summary']}: {best['tokens_per_s'] or 0:,.0f} tokens/s {how}, "
                 f"{best['predicted_tokens_per_s'] or 0:,.0f} predicted, noise {best['noise_cov']:.1%}")
    lines.append(f"verdict   {record['verdict']}: {record['message']}")
    if record["cause"]:
        lines.append(f"cause     {record['cause']}")
    if record["verdict"] == "improvement" and last is not None:
        lines += ["plan diff"] + [f"  {d}" for d in plan_diff(last["best"]["plan"], best["plan"])]
    if emitted:
        prev = emitted[0].parent.with_name("best.prev")
        lines.append(f"emitted   {len(emitted)} file(s) in {emitted[0].parent}" +
                     (f" (the previous ones in {prev})" if prev.exists() else ""))
    lines.append(f"history   {history} ({num_records} records)")
    return "\n".join(lines)
