"""Several ``autotune worker`` processes on one study in a real PostgreSQL (started by ``pg_server.py``).

The study is created once (``autotune search --create-only``) and the workers only join it. Trials are the
simulate backend's predictions; ``AUTOTUNE_SLOWDOWN_MS`` makes each simulated step take real time, so
workers overlap and a worker can be killed in the middle of a trial.
"""

from __future__ import annotations

import re
import time

import pytest
from optuna.trial import TrialState
from pg_server import postgres_url  # noqa: F401  (the session fixture)
from scaleout_helpers import SIMULATE_7B, autotune, kill_9, launched, load, spawn, states, wait_for

from autotune.scaleout import GRACE_FACTOR

_HEARTBEAT_S = 1


def _create(name: str, url: str, tmp_path, top: int) -> None:
    done = autotune(
        "search",
        *SIMULATE_7B,
        "--study",
        name,
        "--storage",
        url,
        "--create-only",
        "--top",
        str(top),
        "--out",
        "runs",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert f"autotune worker --study {name} --storage" in done.stdout


def _worker(
    name: str,
    url: str,
    tmp_path,
    node: str,
    trials: int,
    slowdown_ms: int,
    heartbeat_s: int = _HEARTBEAT_S,
    elsewhere: bool = False,
):
    return spawn(
        "worker",
        "--study",
        name,
        "--storage",
        url,
        "--trials",
        str(trials),
        "--heartbeat",
        str(heartbeat_s),
        "--out",
        f"runs-{node}",
        cwd=tmp_path,
        log=tmp_path / f"{node}.log",
        env={"AUTOTUNE_SLOWDOWN_MS": str(slowdown_ms)},
        elsewhere=elsewhere,
    )


@pytest.mark.dist(timeout=150)
def test_three_workers_share_one_study_without_losing_or_duplicating_a_trial(postgres_url, tmp_path):  # noqa: F811
    _create("three", postgres_url, tmp_path, top=3)
    workers = [
        _worker("three", postgres_url, tmp_path, f"node{i}", trials=4, slowdown_ms=40, heartbeat_s=10)
        for i in range(3)
    ]  # no worker dies here: a long grace, so a loaded CI box cannot fake one
    for w in workers:
        assert w.wait(timeout=120) == 0, (tmp_path / f"node{workers.index(w)}.log").read_text()
    said = [
        int(re.search(r"launched (\d+) trial", (tmp_path / f"node{i}.log").read_text()).group(1))
        for i in range(3)
    ]
    assert said == [4, 4, 4]

    study = load("three", postgres_url)
    numbers = [t.number for t in study.get_trials()]
    assert sorted(numbers) == list(range(len(numbers)))  # unique, no gaps
    ran = launched(study)
    assert len(ran) == sum(said)  # every trial a worker launched is in the study, finished
    assert {s for s in states(study)} <= {"COMPLETE", "PRUNED"}  # nothing RUNNING, WAITING or FAIL
    queued = [t for t in ran if t.user_attrs.get("source") == "cost model"]
    assert len(queued) == 3 and len({tuple(sorted(t.params.items())) for t in queued}) == 3  # each ran once


@pytest.mark.dist(timeout=150)
def test_a_worker_killed_mid_trial_has_its_trial_failed_and_retried(postgres_url, tmp_path):  # noqa: F811
    _create("killed", postgres_url, tmp_path, top=1)
    victim = _worker(
        "killed",
        postgres_url,
        tmp_path,
        "victim",
        trials=1,
        slowdown_ms=5000,  # 35 s trial
        elsewhere=True,
    )  # as on another node: only the heartbeat can tell that it died

    def running():
        trials = load("killed", postgres_url).get_trials(states=(TrialState.RUNNING,))
        return trials[0] if trials and "plan" in trials[0].user_attrs else None  # judged, so running

    trial = wait_for("the victim's trial to run", running, timeout=60, procs=[victim])
    time.sleep(1.5 * _HEARTBEAT_S)  # it has beaten at least once
    kill_9(victim)
    assert load("killed", postgres_url).trials[trial.number].state is TrialState.RUNNING  # nobody told it
    time.sleep(GRACE_FACTOR * _HEARTBEAT_S + 1.0)

    survivor = _worker("killed", postgres_url, tmp_path, "survivor", trials=1, slowdown_ms=0)
    assert survivor.wait(timeout=90) == 0, (tmp_path / "survivor.log").read_text()
    study = load("killed", postgres_url)
    assert study.trials[trial.number].state is TrialState.FAIL
    retries = [t for t in study.trials if t.system_attrs.get("failed_trial") == trial.number]
    assert len(retries) == 1 and retries[0].state is TrialState.COMPLETE
    assert retries[0].params == trial.params and retries[0].user_attrs["status"] == "ok"
    assert "RUNNING" not in states(study) and "WAITING" not in states(study)
