"""One trial as a study stores it: ``TrialRecord``, read from an Optuna trial's ``user_attrs``, and the one
definition of "the same plan" (``plan_key``).

The study stays a plain Optuna study (any Optuna tool can open it), so the record is kept in ``user_attrs``
under the keys of ``Attr``; those keys and their values are the storage format, unchanged from the studies
written before this module, which load as they are (tests/test_trialrecord.py reads one). Search, retune,
report and calibration read trials through ``record_of`` and write them through the ``*_attrs`` functions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from autotune.plan import ParallelPlan
from autotune.space import params_of
from autotune.trials.result import TrialResult, TrialStatus

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from autotune.costmodel import Estimate

__all__ = [
    "Attr",
    "FAILED",
    "MEASURED_FIELDS",
    "TrialRecord",
    "record_of",
    "plan_key",
    "predicted_attrs",
    "outcome_attrs",
]


class Attr(str, Enum):
    """The ``user_attrs`` keys of a trial."""

    PLAN = "plan"
    """The judged plan, ``ParallelPlan.to_dict()`` (collapsed knobs normalised)."""
    PREDICTED = "predicted"
    """The cost model's figures for it (``predicted_attrs``)."""
    MEASURED = "measured"
    """What the trial measured (``MEASURED_FIELDS``); only where the backend measures."""
    STATUS = "status"
    """A ``TrialStatus`` value, or ``resume.INTERRUPTED``."""
    VALUE_SOURCE = "value_source"
    """``measured`` or ``predicted``: where the trial's value came from."""
    ERROR = "error"
    REASON = "reason"
    """Why an infeasible plan never launched."""
    DUPLICATE_OF = "duplicate_of"
    """The number of the trial whose outcome this one repeats (the plan ran once)."""
    SOURCE = "source"
    """Who queued it: ``cost model``, ``history``, ``retune``, ..."""

    def __str__(self) -> str:
        return self.value


FAILED = frozenset({TrialStatus.OOM, TrialStatus.TIMEOUT, TrialStatus.ERROR, TrialStatus.RENDEZVOUS_ERROR})
"""Launched and produced no value."""
MEASURED_FIELDS = ("tokens_per_s", "step_time_s", "step_time_cov", "peak_memory_bytes", "mfu", "wall_s")


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialRecord:
    number: int
    value: float | None
    """Optuna's value: tokens/s of a finished trial."""
    state: str
    """Optuna's state, lower case (``complete``, ``pruned``, ``fail``, ``running``, ``waiting``)."""
    plan: Mapping[str, Any] | None
    """The stored plan as written (``parallel_plan`` parses it); None before the trial was judged."""
    predicted: Mapping[str, Any]
    measured: Mapping[str, Any]
    status: str | None
    """The stored status; None while the trial has none (queued, running, or told before it was judged)."""
    value_source: str | None
    error: str | None
    reason: str | None
    duplicate_of: int | None
    source: str | None

    @property
    def parallel_plan(self) -> ParallelPlan | None:
        return None if self.plan is None else ParallelPlan.from_dict(dict(self.plan))

    @property
    def key(self) -> str | None:
        """``plan_key`` of the stored plan."""
        plan = self.parallel_plan
        return None if plan is None else plan_key(plan)

    @property
    def shown_status(self) -> str:
        """The status, else the Optuna state."""
        return self.status if self.status is not None else self.state

    @property
    def failed(self) -> bool:
        return self.status in FAILED

    @property
    def is_duplicate(self) -> bool:
        return self.duplicate_of is not None


def record_of(trial: FrozenTrial) -> TrialRecord:
    """The record of one Optuna trial (missing keys: an older or not yet judged trial)."""
    attrs = trial.user_attrs
    duplicate = attrs.get(Attr.DUPLICATE_OF.value)
    return TrialRecord(
        number=trial.number,
        value=trial.value,
        state=trial.state.name.lower(),
        plan=attrs.get(Attr.PLAN.value),
        predicted=attrs.get(Attr.PREDICTED.value, {}),
        measured=attrs.get(Attr.MEASURED.value, {}),
        status=attrs.get(Attr.STATUS.value),
        value_source=attrs.get(Attr.VALUE_SOURCE.value),
        error=attrs.get(Attr.ERROR.value),
        reason=attrs.get(Attr.REASON.value),
        duplicate_of=None if duplicate is None else int(duplicate),
        source=attrs.get(Attr.SOURCE.value),
    )


def plan_key(plan: ParallelPlan) -> str:
    """One key per plan: its knobs (``space.params_of``), so that parameters that differ only in knobs the
    plan ignores (the schedule at PP 1, virtual stages outside interleaving, ...) are the same plan.
    Within a study the rest of a plan (batch, sequence, DP) is fixed; benchmarks/landscape.py stores it."""
    return json.dumps(params_of(plan), sort_keys=True, default=str)


def predicted_attrs(est: Estimate) -> dict[str, Any]:
    """``Attr.PREDICTED``: the cost model's figures for a plan."""
    return {
        "tokens_per_s": est.tokens_per_s,
        "mfu": est.mfu,
        "step_time_s": est.step_time_s,
        "memory_bytes_per_gpu": est.memory_bytes_per_gpu,
        "bottleneck": est.bottleneck,
        "memory_capacity_bytes": est.memory_capacity_bytes,
    }


def outcome_attrs(result: TrialResult, *, measured: bool) -> dict[str, Any]:
    """``Attr.STATUS``, ``VALUE_SOURCE``, ``MEASURED`` (measuring backends) and ``ERROR`` of a finished trial,
    in the order they are written."""
    attrs: dict[str, Any] = {
        Attr.STATUS.value: str(result.status),
        Attr.VALUE_SOURCE.value: "measured" if measured else "predicted",
    }
    if measured:
        attrs[Attr.MEASURED.value] = {
            k: v for k, v in result.to_dict().items() if k in MEASURED_FIELDS and v is not None
        }
    if result.error:
        attrs[Attr.ERROR.value] = result.error
    return attrs
