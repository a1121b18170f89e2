"""What a stopped search leaves, and how the next run of the study picks it up.

* Stopped by a signal (``autotune.interrupt``): the trial's processes are already ended by the runner; a
  trial whose ``result.json`` was written in time keeps that result (``adopt``), any other is told FAIL
  with status ``interrupted`` and its plan queued again (``interrupted``).
* Killed (SIGKILL, a lost node): its trial stays RUNNING and its torchrun may run on. ``repair``, run by
  ``run_study`` before it asks for a trial, ends those processes (``autotune.trials.orphans``), adopts a
  finished result, and fails the rest through ``autotune.scaleout.fail_stale`` (which queues them again).

Either way the queued plan runs first (``first_trials`` then ``ask_first``): the trial that was running is
usually the cost model's best plan, and a ``--trials N`` that queued it behind the rest might never reach it.
Only trials whose process is known dead on this host are touched; others' running trials are left alone.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.scaleout import fail_stale, owner_dead_here, requeue
from autotune.trials.orphans import end_orphans
from autotune.trials.result import TrialResult, TrialStatus

__all__ = [
    "INTERRUPTED",
    "trial_dir_of",
    "finished_result",
    "adopt",
    "interrupted",
    "repair",
    "first_trials",
    "ask_first",
]

INTERRUPTED = "interrupted"
"""The ``status`` user attr of a trial stopped by a signal before it had a result."""
Record = Callable[[optuna.Study, optuna.Trial, TrialResult, bool], None]
Log = Callable[[str], None] | None


def trial_dir_of(trials_dir: Path, number: int) -> Path:
    return trials_dir / f"{number:05d}"


def finished_result(trial_dir: Path) -> TrialResult | None:
    """The ``ok`` result rank 0 wrote for a trial nobody classified (its supervisor stopped), if any."""
    try:
        result = TrialResult.read(trial_dir / "result.json")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return result if result.status is TrialStatus.OK and result.tokens_per_s else None


def adopt(study: optuna.Study, trial: optuna.Trial, trial_dir: Path, measured: bool, record: Record) -> bool:
    """Tell ``trial`` the finished result in ``trial_dir``; False when it has none."""
    result = finished_result(trial_dir)
    if result is None:
        return False
    trial.set_user_attr("adopted", "its result was read after its search stopped")
    record(study, trial, result, measured)
    return True


def interrupted(
    study: optuna.Study, trial: optuna.Trial, trial_dir: Path, measured: bool, record: Record
) -> str:
    """A trial stopped by a signal: keep its result if it finished, else fail it and queue its plan again.
    Returns one line for the user."""
    if _state(study, trial._trial_id) is not TrialState.RUNNING:
        return ""
    if adopt(study, trial, trial_dir, measured, record):
        return f"; trial {trial.number} had finished and its result is kept"
    trial.set_user_attr("status", INTERRUPTED)
    frozen = study.tell(trial, state=TrialState.FAIL)
    if frozen.params:
        requeue(study, frozen, charged=False)  # the user stopped it: no retry of the plan's budget is spent
        return f"; trial {trial.number} was stopped and its plan runs first on --resume"
    return ""


def repair(study: optuna.Study, trials_dir: Path, measured: bool, record: Record, log: Log = None) -> None:
    """End the processes of trials whose search died here, adopt their finished results, fail the rest."""
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not owner_dead_here(frozen):
            continue
        trial_dir = trial_dir_of(trials_dir, frozen.number)
        ended = end_orphans(trial_dir) if trial_dir.is_dir() else []
        if log and ended:
            log(f"trial {frozen.number}: its search had died; ended {len(ended)} process(es) it left")
        trial = optuna.Trial(study, frozen._trial_id)
        if (
            _state(study, frozen._trial_id) is TrialState.RUNNING
            and adopt(study, trial, trial_dir, measured, record)
            and log
        ):
            log(f"trial {frozen.number}: finished after its search died; its result is kept")
    fail_stale(study)  # the others: FAIL, their plans queued again


def first_trials(study: optuna.Study) -> list[int]:
    """Queued retries of trials that were stopped or died: the trial ids to run before anything else."""
    return [
        t._trial_id
        for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if "failed_trial" in t.system_attrs
    ]


def ask_first(study: optuna.Study, first: list[int]) -> optuna.Trial:
    """``study.ask()``, but a queued trial of ``first`` (consumed from the front) is taken before the rest
    of the queue, as ``Study.ask`` takes the oldest (``Study._pop_waiting_trial_id``)."""
    storage = study._storage
    while first:
        trial_id = first.pop(0)
        try:
            if storage.set_trial_state_values(trial_id, state=TrialState.RUNNING):
                return optuna.Trial(study, trial_id)
        except optuna.exceptions.UpdateFinishedTrialError:  # another worker took it first
            continue
    return study.ask()


def _state(study: optuna.Study, trial_id: int) -> TrialState:
    frozen: FrozenTrial = study._storage.get_trial(trial_id)
    return frozen.state
