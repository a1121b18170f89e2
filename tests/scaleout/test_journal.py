"""A study in a journal file (``--storage journal:///path``: no database server, e.g. NFS only): workers share
it, and a worker killed mid-trial has its trial failed and re-queued through autotune's own heartbeat
(Optuna's JournalStorage has none). Simulate backend; ``AUTOTUNE_SLOWDOWN_MS`` makes trials take time."""

from __future__ import annotations

import re
import time

import pytest
from optuna.trial import TrialState
from scaleout_helpers import SIMULATE_7B, autotune, kill_9, launched, load, spawn, states, wait_for

from autotune.scaleout import GRACE_FACTOR

_HEARTBEAT_S = 2  # journal writes take the file lock: a longer grace than on PostgreSQL


def _worker(url, tmp_path, node, trials, slowdown_ms, elsewhere=False):
    return spawn(
        "worker",
        "--study",
        "j",
        "--storage",
        url,
        "--trials",
        str(trials),
        "--heartbeat",
        str(_HEARTBEAT_S),
        "--out",
        f"runs-{node}",
        cwd=tmp_path,
        log=tmp_path / f"{node}.log",
        env={"AUTOTUNE_SLOWDOWN_MS": str(slowdown_ms)},
        elsewhere=elsewhere,
    )


@pytest.mark.dist(timeout=150)
def test_journal_workers_share_a_study_and_a_killed_workers_trial_is_retried(tmp_path):
    url = f"journal://{tmp_path / 'shared' / 'j.log'}"  # journal:///abs/path
    (tmp_path / "shared").mkdir()
    done = autotune(
        "search",
        *SIMULATE_7B,
        "--study",
        "j",
        "--storage",
        url,
        "--create-only",
        "--top",
        "2",
        "--out",
        "runs",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr

    victim = _worker(url, tmp_path, "victim", trials=1, slowdown_ms=5000, elsewhere=True)  # "another node"

    def running():
        trials = load("j", url).get_trials(states=(TrialState.RUNNING,))
        launched_ = trials and "plan" in trials[0].user_attrs  # judged, so in its 35 s trial
        return trials[0] if launched_ and "autotune_heartbeat" in trials[0].system_attrs else None

    orphan = wait_for("the victim's trial to beat", running, timeout=60, procs=[victim])
    kill_9(victim)
    time.sleep(GRACE_FACTOR * _HEARTBEAT_S + 1.0)
    workers = [_worker(url, tmp_path, f"node{i}", trials=3, slowdown_ms=30) for i in range(2)]
    for i, w in enumerate(workers):
        assert w.wait(timeout=90) == 0, (tmp_path / f"node{i}.log").read_text()

    study = load("j", url)
    numbers = [t.number for t in study.trials]
    assert sorted(numbers) == list(range(len(numbers)))
    said = sum(
        int(re.search(r"launched (\d+) trial", (tmp_path / f"node{i}.log").read_text()).group(1))
        for i in range(2)
    )
    assert said == 6 and len(launched(study)) == 6
    assert study.trials[orphan.number].state is TrialState.FAIL
    (retry,) = [t for t in study.trials if t.system_attrs.get("failed_trial") == orphan.number]
    assert retry.state is TrialState.COMPLETE and retry.params == study.trials[orphan.number].params
    assert "RUNNING" not in states(study) and "WAITING" not in states(study)
