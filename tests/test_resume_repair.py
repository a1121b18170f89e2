"""What ``run_study`` repairs before its first trial (``autotune.resume``), on a fake process tree and an
in-process study: fast companions of the real-process tests in ``tests/trials/test_stop_and_resume.py``."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import optuna
import pytest
from fakesearch import RecordingBackend, fake_estimate, fake_ranking
from optuna.trial import TrialState

from autotune.scaleout import _OWNER, _host, beat
from autotune.search import StudyOptions, run_study
from autotune.trials.orphans import (
    AGENTS_FILE,
    end_orphans,
    live_trial_pids,
    record_agents,
    start_ticks,
    this_host,
)
from autotune.trials.result import TrialResult, TrialStatus

_AGENT = """
import subprocess, sys, time
# a 'torchrun' that starts a 'rank' in a session of its own, as torch.distributed.elastic does
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "--trial-dir", sys.argv[2]],
                 start_new_session=True)
time.sleep(300)
"""


@pytest.fixture(autouse=True)
def _quiet_optuna():
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _fake_trial(trial_dir):
    """An orphaned agent and its rank, both naming ``trial_dir``, in agents.json as the runner records."""
    trial_dir.mkdir(parents=True)
    agent = subprocess.Popen(
        [sys.executable, "-c", _AGENT, "--trial-dir", str(trial_dir)], start_new_session=True
    )
    deadline = time.monotonic() + 60
    while len(live_trial_pids(trial_dir)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    record_agents(trial_dir, [agent.pid])
    return agent


def test_end_orphans_ends_the_agents_group_and_its_ranks(tmp_path):
    trial_dir = tmp_path / "00000"
    agent = _fake_trial(trial_dir)
    assert len(live_trial_pids(trial_dir)) == 2
    found = end_orphans(trial_dir, grace_s=2)
    agent.wait(timeout=10)
    assert agent.pid in found and len(found) == 2
    assert live_trial_pids(trial_dir) == []


def test_a_reused_pid_is_never_signalled(tmp_path):
    """agents.json names a pid with another start time (the pid was reused): that process is left alone."""
    bystander = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True
    )
    try:
        tmp_path.joinpath(AGENTS_FILE).write_text(
            json.dumps(
                [
                    {
                        "host": this_host(),
                        "pid": bystander.pid,
                        "start": str(int(start_ticks(bystander.pid)) - 1),
                    }
                ]
            )
        )
        assert end_orphans(tmp_path, grace_s=0.5) == []
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def _dead_owner(study, trial):
    """Make ``trial`` look as if the search that asked for it was SIGKILLed (a pid of this host, now gone)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    study._storage.set_trial_system_attr(trial._trial_id, _OWNER, f"{_host()}:{gone.pid}:1")


def _killed_mid_trial(tmp_path, *, finished: bool):
    """A study whose search died during trial 0 (the cost model's #1 plan), with 2 more plans queued."""
    study, ranking = optuna.create_study(direction="maximize"), fake_ranking()
    run_study(
        study,
        ranking,
        RecordingBackend(),
        StudyOptions(n_trials=0, top_k=3),
        trials_dir=tmp_path,
        estimator=fake_estimate,
    )
    trial = study.ask()
    beat(study, trial)
    _dead_owner(study, trial)
    agent = _fake_trial(tmp_path / f"{trial.number:05d}")
    if finished:
        TrialResult(status=TrialStatus.OK, tokens_per_s=1234.0).write(
            tmp_path / f"{trial.number:05d}" / "result.json"
        )
    return study, ranking, trial, agent


@pytest.mark.slow
def test_resume_after_sigkill_ends_the_orphans_and_runs_the_dead_trials_plan_first(tmp_path):
    study, ranking, trial, agent = _killed_mid_trial(tmp_path, finished=False)
    dead_plan = study.trials[trial.number].system_attrs["fixed_params"]
    backend = RecordingBackend()
    run_study(
        study,
        ranking,
        backend,
        StudyOptions(n_trials=1, top_k=3),
        trials_dir=tmp_path,
        estimator=fake_estimate,
    )
    agent.wait(timeout=10)
    assert live_trial_pids(tmp_path / f"{trial.number:05d}") == []
    assert study.trials[trial.number].state is TrialState.FAIL
    (retry,) = [t for t in study.trials if t.system_attrs.get("failed_trial") == trial.number]
    assert retry.state is TrialState.COMPLETE and retry.params == dead_plan  # before the 2 queued plans
    assert len(backend.plans) == 1


@pytest.mark.slow
def test_resume_keeps_a_result_the_orphan_finished(tmp_path):
    study, ranking, trial, agent = _killed_mid_trial(tmp_path, finished=True)
    backend = RecordingBackend()
    run_study(
        study,
        ranking,
        backend,
        StudyOptions(n_trials=1, top_k=3),
        trials_dir=tmp_path,
        estimator=fake_estimate,
    )
    agent.wait(timeout=10)
    kept = study.trials[trial.number]
    assert kept.state is TrialState.COMPLETE and kept.value == 1234.0 and kept.user_attrs["adopted"]
    assert not [t for t in study.trials if t.system_attrs.get("failed_trial") == trial.number]


@pytest.mark.slow
def test_a_result_written_as_the_signal_came_is_kept(tmp_path):
    """The trial had finished (rank 0 wrote result.json) when SIGTERM came: its measurement is kept."""

    class FinishedThenStopped(RecordingBackend):
        def run(self, request, report=None):
            request.trial_dir.mkdir(parents=True)
            TrialResult(status=TrialStatus.OK, tokens_per_s=99.0).write(request.trial_dir / "result.json")
            raise KeyboardInterrupt

    study = optuna.create_study(direction="maximize")
    with pytest.raises(KeyboardInterrupt) as stopped:
        run_study(
            study,
            fake_ranking(),
            FinishedThenStopped(),
            StudyOptions(n_trials=1, top_k=1),
            trials_dir=tmp_path,
            estimator=fake_estimate,
        )
    assert "its result is kept" in stopped.value.resume_hint
    (trial,) = study.trials
    assert trial.state is TrialState.COMPLETE and trial.value == 99.0


def test_a_stop_signal_while_trial_processes_start_waits_until_they_are_known():
    """A SIGTERM inside ``subprocess.Popen`` (after its fork) would leave a torchrun nobody stops: inside
    ``held`` it is raised when the block ends, once; a second signal while stopping is ignored."""
    import os
    import signal

    from autotune.interrupt import Interrupted, held, signals_interrupt

    steps = []
    with signals_interrupt(), pytest.raises(Interrupted) as stopped:
        with held():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            steps.append("started")
    assert steps == ["started"] and stopped.value.exit_code == 143


def test_stops_by_signal_do_not_spend_the_retry_budget():
    """Was (fuzz seed 576): SIGINT, SIGTERM, then SIGKILL of the same plan's tries used up ``MAX_RETRY`` and
    the plan the kill left was never run again."""
    import optuna
    from optuna.distributions import IntDistribution
    from optuna.trial import TrialState

    from autotune.scaleout import MAX_RETRY, requeue

    study = optuna.create_study()
    study.add_trial(
        optuna.create_trial(
            state=TrialState.FAIL, params={"tp": 1}, distributions={"tp": IntDistribution(1, 8)}
        )
    )
    for _ in range(MAX_RETRY + 2):  # user stops: each re-queued, none charged
        requeue(study, study.trials[-1], charged=False)
        assert study.trials[-1].state is TrialState.WAITING
        study._storage.set_trial_state_values(study.trials[-1]._trial_id, state=TrialState.FAIL)
    for _ in range(MAX_RETRY):  # crashes: charged, re-queued MAX_RETRY times, then no more
        requeue(study, study.trials[-1])
        assert study.trials[-1].state is TrialState.WAITING
        study._storage.set_trial_state_values(study.trials[-1]._trial_id, state=TrialState.FAIL)
    count = len(study.trials)
    requeue(study, study.trials[-1])
    assert len(study.trials) == count


def test_a_stop_signal_while_a_plan_is_suggested_requeues_the_whole_plan(tmp_path):
    """Was (fuzz seed 1901): SIGINT between two ``suggest_categorical`` calls queued a retry holding part of
    a plan; ``--resume`` sampled the rest afresh and ran another plan. The suggestion is now ``held``."""
    import os
    import signal

    from autotune.interrupt import Interrupted, signals_interrupt
    from autotune.space import KNOBS

    class StopMidPlan(optuna.samplers.RandomSampler):
        calls = 0

        def sample_independent(self, study, trial, name, distribution):
            StopMidPlan.calls += 1
            if StopMidPlan.calls == 3:  # the third knob of the first plan TPE would propose
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
            return super().sample_independent(study, trial, name, distribution)

    study = optuna.create_study(direction="maximize", sampler=StopMidPlan(seed=0))
    backend = RecordingBackend()
    with signals_interrupt(), pytest.raises(Interrupted) as stopped:
        run_study(
            study,
            fake_ranking(),
            backend,
            StudyOptions(n_trials=3, top_k=0),
            trials_dir=tmp_path,
            estimator=fake_estimate,
        )
    assert "runs first on --resume" in stopped.value.resume_hint and backend.plans == []
    stopped_try, retry = study.trials
    assert stopped_try.state is TrialState.FAIL and retry.state is TrialState.WAITING
    assert set(stopped_try.params) == set(retry.params) == set(KNOBS)
