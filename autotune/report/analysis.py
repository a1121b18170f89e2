"""Statistics over a study's trials: cost-model error (MAPE, Kendall tau), the Pareto front, parameter
importances (Optuna's own), and why trials were pruned or failed."""

from __future__ import annotations

import math
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.trialrecord import record_of
from autotune.trials.result import TrialStatus

if TYPE_CHECKING:
    from autotune.report.data import PlanRow

__all__ = [
    "ModelError",
    "kendall_tau",
    "pareto_front",
    "model_error",
    "importances",
    "pruned",
    "failed",
    "status_of",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelError:
    """The cost model against measurements on this cluster (measured trials only)."""

    pairs: tuple[tuple[int, float, float], ...]
    """(trial, predicted tokens/s, measured tokens/s)."""
    mape: float
    kendall_tau: float | None
    """None with fewer than two measured trials."""


def kendall_tau(xs: list[float], ys: list[float]) -> float | None:
    """Kendall's tau-b (ties in either ranking handled); None when undefined (< 2 points or all tied)."""
    conc = disc = ties_x = ties_y = 0
    for i in range(len(xs)):
        for j in range(i + 1, len(xs)):
            dx, dy = _sign(xs[i] - xs[j]), _sign(ys[i] - ys[j])
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif dx == dy:
                conc += 1
            else:
                disc += 1
    denom = math.sqrt((conc + disc + ties_x) * (conc + disc + ties_y))
    return (conc - disc) / denom if denom else None


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def pareto_front(rows: list[PlanRow]) -> list[PlanRow]:
    """Plans no other plan beats on both tokens/s and memory headroom, fastest first."""
    front: list[PlanRow] = []
    for row in sorted(rows, key=lambda r: (-r.tokens_per_s, -r.headroom_bytes)):
        if not front or row.headroom_bytes > front[-1].headroom_bytes:
            front.append(row)
    return front


def importances(study: Any) -> tuple[dict[str, float] | None, str]:
    """Optuna's parameter importances (its default evaluator: PED-ANOVA in Optuna 5)."""
    import optuna

    done = [t for t in study.get_trials(deepcopy=False) if t.value is not None]
    if len(done) < 2:
        return None, f"needs at least 2 finished trials (this study has {len(done)})"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = optuna.importance.get_param_importances(study)
    except (RuntimeError, ValueError, ZeroDivisionError) as e:
        return None, f"Optuna could not compute them ({_first_line(e) or type(e).__name__})"
    return {k: float(v) for k, v in found.items()}, f"{len(done)} finished trials, Optuna's default evaluator"


def model_error(rows: list[PlanRow]) -> ModelError | None:
    pairs = tuple((r.trial, r.predicted_tokens_per_s, r.tokens_per_s) for r in rows if r.measured)
    if not pairs:
        return None
    mape = sum(abs(p - m) / m for _, p, m in pairs) / len(pairs)
    tau = kendall_tau([p for _, p, _ in pairs], [m for _, _, m in pairs]) if len(pairs) >= 2 else None
    return ModelError(pairs=pairs, mape=mape, kendall_tau=tau)


def pruned(trials: list[Any]) -> dict[str, int]:
    """Proposals that never launched, by the rule or cost-model reason (numbers stripped)."""
    from autotune.ranking import rule_of

    records = [record_of(t) for t in trials]
    reasons = [str(r.reason) for r in records if r.status == TrialStatus.INFEASIBLE and r.reason is not None]
    counts = Counter(rule_of(r) if ":" in r else r for r in reasons)  # rules carry no numbers to strip
    return dict(counts.most_common())


def failed(trials: list[Any]) -> dict[str, int]:
    records = [record_of(t) for t in trials]
    counts = Counter(
        f"{r.shown_status}: {_first_line(r.error)}".rstrip(": ")
        for r in records
        if (r.failed or r.shown_status == TrialStatus.PRUNED) and not r.is_duplicate
    )
    return dict(counts.most_common())


def _first_line(text: Any) -> str:
    return (str(text or "").splitlines() or [""])[0][:100]


def status_of(trial: Any) -> str:
    """What became of a trial: autotune's ``status`` attr, else Optuna's state (``waiting`` = enqueued)."""
    return record_of(trial).shown_status
