"""Calibrate from a study's measured trials; store the fit with the study.

``calibrate_study`` reads every launched trial that measured a step time (duplicates of one plan once), fits
``fit.Factors`` to them, and stores the result three ways:

* ``runs/<study>/calibration.yaml``: a complete hardware profile of the calibrated cluster (``--profile``
  takes it, so later estimates and searches use the fit), the fit, every trial's predicted vs measured time;
* the study's user attr ``calibration`` (the summary block below, without the per-trial rows);
* the returned block, which ``autotune search`` puts in ``summary.json`` under ``calibration``::

    {kendall_tau, mape,                      # after the fit, on the fitted trials
     before: {kendall_tau, mape, num_trials}, after: {...}, factors: {...}, fitted: [...],
     holdout: {before: {...}, after: {...}} | null, num_trials, path, trials: [{trial, measured_s,
     predicted_before_s, predicted_after_s, held_out}]}
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.calibrate.fit import Factors, FitResult, Observation, fidelity, fit
from autotune.plan import ParallelPlan
from autotune.probe.profile import cluster_overrides, write_profile
from autotune.render import plan_summary
from autotune.specs import ClusterSpec, ModelSpec
from autotune.trialrecord import plan_key, record_of
from autotune.trials.result import TrialStatus

__all__ = ["MIN_TRIALS", "observations", "calibrate_study", "calibration_block"]

MIN_TRIALS = 3
"""Measured plans a calibration needs (three efficiency factors; the overheads need more, see ``fit``)."""


def observations(study: Any) -> list[Observation]:
    """One observation per measured plan of the study (the first trial that measured it)."""
    seen: set[str] = set()
    out = []
    for record in map(record_of, study.get_trials(deepcopy=False)):
        step_s = record.measured.get("step_time_s")
        plan = record.parallel_plan if record.status == TrialStatus.OK and not record.is_duplicate else None
        if plan is None or not step_s:
            continue
        key = plan_key(plan)
        if key not in seen:
            seen.add(key)
            out.append(Observation(plan=plan, measured_s=float(step_s), label=str(record.number)))
    return out


def _split(
    obs: Sequence[Observation], holdout: float, seed: int
) -> tuple[list[Observation], list[Observation]]:
    shuffled = list(obs)
    random.Random(seed).shuffle(shuffled)
    n_out = int(round(holdout * len(shuffled)))
    n_out = min(n_out, len(shuffled) - MIN_TRIALS) if holdout > 0 else 0
    return shuffled[max(0, n_out) :], shuffled[: max(0, n_out)]


def calibration_block(
    model: ModelSpec, cluster: ClusterSpec, result: FitResult, held_out: Sequence[Observation] = ()
) -> dict[str, Any]:
    """The summary's ``calibration`` object for a fit (``held_out``: plans the fit did not see)."""

    def rows(before: Any, after: Any, held: bool) -> list[dict[str, Any]]:
        return [
            {
                "trial": label,
                "measured_s": m,
                "predicted_before_s": b,
                "predicted_after_s": a,
                "held_out": held,
            }
            for label, m, b, a in zip(
                after.labels, after.measured_s, before.predicted_s, after.predicted_s, strict=True
            )
        ]

    table = rows(result.before, result.after, False)
    holdout = None
    if held_out:
        before = fidelity(model, cluster, held_out)
        after = fidelity(model, result.factors.apply(cluster), held_out)
        holdout = {"before": before.as_dict(), "after": after.as_dict()}
        table += rows(before, after, True)
    return {
        "kendall_tau": result.after.kendall_tau,
        "mape": result.after.mape,
        "before": result.before.as_dict(),
        "after": result.after.as_dict(),
        "factors": result.factors.as_dict(),
        "fitted": list(result.fitted),
        "unidentified": list(result.unidentified),
        "rms_log_error": result.rms_log_error,
        "holdout": holdout,
        "num_trials": len(result.after.measured_s),
        "trials": table,
    }


def _profile_doc(
    name: str, base: ClusterSpec, factors: Factors, block: dict[str, Any], plans: dict[str, ParallelPlan]
) -> dict[str, Any]:
    """calibration.yaml: the calibrated cluster as a ``--profile`` (everything of the base profile and the
    fitted factors that a profile can carry: ``probe.profile.cluster_overrides``) plus the fit."""
    trials = [row | {"plan": plan_summary(plans[row["trial"]])} for row in block["trials"]]
    return {
        "name": name,
        "kind": "calibration",
        "measured": time.strftime("%Y-%m-%d %H:%M:%S"),
        "source": f"fit to {len(trials)} measured trials of study {name} "
        f"(autotune.calibrate; base: {base.profile or 'the catalog'})",
        **cluster_overrides(factors.apply(base)),
        "fit": {k: v for k, v in block.items() if k != "trials"},
        "trials": trials,
    }


def calibrate_study(
    study: Any,
    model: ModelSpec,
    cluster: ClusterSpec,
    study_dir: Path,
    *,
    holdout: float = 0.0,
    seed: int = 0,
) -> dict[str, Any] | None:
    """Fit, write ``calibration.yaml``, set the study's user attr; returns the summary block (None: too
    few measured trials)."""
    obs = observations(study)
    if len(obs) < MIN_TRIALS:
        return None
    train, held_out = _split(obs, holdout, seed)
    result = fit(model, cluster, train)
    block = calibration_block(model, cluster, result, held_out)
    path = write_profile(
        _profile_doc(study.study_name, cluster, result.factors, block, {o.label: o.plan for o in obs}),
        study_dir / "calibration.yaml",
    )
    block["path"] = str(path)
    study.set_user_attr("calibration", {k: v for k, v in block.items() if k != "trials"})
    return block
