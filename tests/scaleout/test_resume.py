"""``kill -9`` of ``autotune search`` in the middle of a study, then ``--resume``: no finished trial is lost,
and the trial the dead process left RUNNING is failed (its heartbeat stopped) and run again.

The study is the default one (SQLite in ``runs/<study>/study.db``, WAL); trials are the simulate backend's
predictions, each made to take ~1.4 s of wall time with the ``AUTOTUNE_SLOWDOWN_MS`` diagnostic knob.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from optuna.trial import TrialState
from scaleout_helpers import SIMULATE_7B, autotune, kill_9, launched, load, spawn, states, wait_for


def _created(db: Path) -> bool:
    """The search has created its study (read-only: a reader must not race the creator for the schema)."""
    if not db.exists():
        return False
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)) as conn:
            return bool(conn.execute("SELECT count(*) FROM studies WHERE study_name = 'r'").fetchone()[0])
    except sqlite3.OperationalError:  # no tables yet
        return False


_SLOW = {"AUTOTUNE_SLOWDOWN_MS": "200"}  # 7 simulated steps: ~1.4 s per trial


@pytest.mark.dist(timeout=150)
def test_kill_9_mid_study_then_resume_loses_no_finished_trial(tmp_path):
    argv = [
        "search",
        *SIMULATE_7B,
        "--study",
        "r",
        "--out",
        "runs",
        "--heartbeat",
        "1",
        "--top",
        "2",
        "--quiet",
    ]
    url = f"sqlite:///{tmp_path / 'runs' / 'r' / 'study.db'}"
    proc = spawn(*argv, "--trials", "30", cwd=tmp_path, log=tmp_path / "first.log", env=_SLOW)

    def mid_study():
        if not _created(tmp_path / "runs" / "r" / "study.db"):
            return None
        study = load("r", url)
        running = [
            t
            for t in study.get_trials(states=(TrialState.RUNNING,))
            if "plan" in t.user_attrs and datetime.now() - t.datetime_start < timedelta(seconds=0.8)
        ]  # well before its end
        return study if len(launched(study)) >= 3 and running else None

    wait_for("3 finished trials and one running", mid_study, timeout=90, procs=[proc])
    kill_9(proc)
    before = load("r", url)
    finished = {t.number: (t.params, t.value) for t in launched(before)}
    (orphan,) = before.get_trials(states=(TrialState.RUNNING,))  # the dead process's trial, told nothing
    # (its plan; or, if it died between asking for the trial and choosing the plan, the knobs Optuna had
    # suggested by then, one at a time: none or some. A loaded machine can let the trial the wait saw end
    # and the next one start before the kill.)
    assert len(finished) >= 3

    done = autotune(*argv, "--trials", "5", "--resume", cwd=tmp_path, env=_SLOW, timeout=120)
    assert done.returncode == 0, done.stderr
    after = load("r", url)
    for number, (params, value) in finished.items():  # 0 finished trials lost or changed
        trial = after.trials[number]
        assert (trial.state, trial.params, trial.value) == (TrialState.COMPLETE, params, value)
    assert after.trials[orphan.number].state is TrialState.FAIL
    (retry,) = [t for t in after.trials if t.system_attrs.get("failed_trial") == orphan.number]
    assert retry.state in (TrialState.COMPLETE, TrialState.PRUNED)  # it ran (or was judged) this time
    if "plan" in orphan.user_attrs:  # its whole plan is run again
        assert retry.params == orphan.params
    else:  # the knobs it had are kept, Optuna suggests the rest
        assert orphan.params.items() <= retry.params.items()
    assert len(launched(after)) == len(finished) + 5
    assert "RUNNING" not in states(after) and "WAITING" not in states(after)
