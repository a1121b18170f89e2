"""Stopping ``autotune search`` during a real CPU trial, then ``--resume`` (issue 25, items 2 and 3).

The search runs as a real subprocess with real torchrun trials on 2 CPU ranks (gloo). Slurm, Kubernetes and
systemd stop it with SIGTERM, a closed terminal with SIGHUP, a user with Ctrl-C (SIGINT), the OOM killer or
a preemption with SIGKILL. After any of them: no process of a trial is left running (after SIGKILL: none
once ``--resume`` has run), no completed trial is lost or changed, and the plan that was running is the
first one the next run takes up (or, when its orphan finished meanwhile, its result is kept).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.scaleout import open_storage

_SEARCH = [
    "search",
    "--model",
    "tiny",
    "--gpus",
    "2",
    "--gpu",
    "cpu",
    "--device",
    "cpu",
    "--backend",
    "torchrun",
    "--top",
    "3",
    "--global-batch",
    "8",
    "--seq-len",
    "64",
    "--study",
    "s",
    "--out",
    "runs",
    "--quiet",
    "--heartbeat",
    "1",
]


def _deliverable() -> None:
    """In the child: the stop signals at their defaults, as under an interactive shell. A runner that starts
    pytest with them ignored (``nohup``, ``&`` without job control: both seen as a local ``.ci/run``) would
    otherwise hand that down, and ``autotune.interrupt`` keeps an ignored signal ignored, by design."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _start(tmp_path: Path, trials: int, *extra: str, log: str = "search.log") -> subprocess.Popen[bytes]:
    """``autotune search`` in a session of its own: a signal to its pid reaches it alone, as ``kill`` does."""
    return subprocess.Popen(
        [sys.executable, "-m", "autotune", *_SEARCH, "--trials", str(trials), *extra],
        cwd=tmp_path,
        stdout=(tmp_path / log).open("ab"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_deliverable,
    )


def _trial_processes(tmp_path: Path) -> list[int]:
    """Live processes of any trial under ``tmp_path/runs`` (torchrun and its ranks name their trial dir)."""
    needle = b"--trial-dir\0" + str(tmp_path / "runs").encode()
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle in (entry / "cmdline").read_bytes():
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _trial_dirs(tmp_path: Path) -> set[Path]:
    return set((tmp_path / "runs" / "s" / "trials").glob("*"))


def _running_trial(
    tmp_path: Path, proc: subprocess.Popen[bytes], timeout: float = 240, older: set[Path] = frozenset()
) -> Path:
    """Wait until a trial of ``proc`` (not one of the ``older`` trial directories, which an orphan of a killed
    search may still be running in) has started its ranks and has no result yet; its directory."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, (tmp_path / "search.log").read_text()
        for trial_dir in sorted(_trial_dirs(tmp_path) - older, reverse=True):
            if list(trial_dir.glob("started.*")) and not (trial_dir / "result.json").exists():
                return trial_dir
        time.sleep(0.1)
    raise AssertionError(f"no trial started within {timeout} s")


def _gone_within(tmp_path: Path, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while _trial_processes(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    return _trial_processes(tmp_path)


def _study(tmp_path: Path) -> optuna.Study:
    url = f"sqlite:///{tmp_path / 'runs' / 's' / 'study.db'}"
    return optuna.load_study(study_name="s", storage=open_storage(url, heartbeat_s=None))


def _completed(study: optuna.Study) -> dict[int, tuple[dict, float]]:
    return {
        t.number: (t.params, t.value)
        for t in study.trials
        if t.state is TrialState.COMPLETE and t.user_attrs.get("status") == "ok"
    }


def _started_since(study: optuna.Study, since: datetime) -> list[optuna.trial.FrozenTrial]:
    """Trials that ran a plan, first started first, among those started at or after ``since``."""
    ran = [
        t
        for t in study.trials
        if t.datetime_start
        and t.datetime_start >= since
        and t.params
        and t.user_attrs.get("status") != "infeasible"
        and "duplicate_of" not in t.user_attrs
    ]
    return sorted(ran, key=lambda t: t.datetime_start)


def _left_to_redo(study: optuna.Study) -> tuple[int, dict] | None:
    """(trial, plan) a stopped search left to run again: a signal queues the stopped trial's plan again
    (WAITING, ``failed_trial``); a SIGKILL leaves it RUNNING (``--resume`` ends, adopts or re-queues it)."""
    for t in sorted(study.trials, key=lambda t: t.number, reverse=True):
        waiting_retry = t.state is TrialState.WAITING and "failed_trial" in t.system_attrs
        if t.params and (waiting_retry or t.state is TrialState.RUNNING):
            return t.number, t.params
    return None


def _kill(proc: subprocess.Popen[bytes], sig: signal.Signals) -> int:
    os.kill(proc.pid, sig)
    return proc.wait(timeout=120)


@pytest.mark.slow
@pytest.mark.dist(timeout=150)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_2_a_stop_signal_ends_the_trial_records_it_and_resume_runs_it_first(tmp_path, sig):
    """Was (SIGTERM): exit 143 with no message, torchrun and its ranks re-parented to PID 1 running on; and
    after SIGINT the trial stayed FAIL and was never queued again. Three trials, so that the signal finds the
    search busy even when the trial seen running ends just before it (two left a race: exit 0)."""
    proc = _start(tmp_path, 3)
    _running_trial(tmp_path, proc)
    code = _kill(proc, sig)
    assert code == 128 + sig, (tmp_path / "search.log").read_text()
    assert f"interrupted by {sig.name}" in (tmp_path / "search.log").read_text()
    assert _gone_within(tmp_path, 10) == []  # the search ended its trial's process group before it exited
    left = _left_to_redo(_study(tmp_path))
    if left is None:  # it had finished just as the signal came (its result is kept): nothing to redo
        return
    assert _study(tmp_path).trials[left[0]].state is TrialState.WAITING  # queued again, not left FAIL
    since = datetime.now()
    done = _start(tmp_path, 1, "--resume", log="resume.log").wait(timeout=300)
    assert done == 0, (tmp_path / "resume.log").read_text()
    first = _started_since(_study(tmp_path), since)[0]
    assert first.params == left[1] and first.state is TrialState.COMPLETE  # measured, and first


@pytest.mark.slow
@pytest.mark.dist(timeout=150)
def test_3_after_sigkill_resume_ends_the_orphans_and_runs_their_plan_first(tmp_path):
    """Was: the orphan ran on; on --resume its plan was queued behind the others, where --trials 1 never
    reached it."""
    proc = _start(tmp_path, 3)
    _running_trial(tmp_path, proc)
    _kill(proc, signal.SIGKILL)
    assert _trial_processes(tmp_path)  # the original failure: torchrun and its ranks live on
    before = _study(tmp_path)
    left, completed = _left_to_redo(before), _completed(before)
    assert left is not None and before.trials[left[0]].state is TrialState.RUNNING
    since = datetime.now()
    done = _start(tmp_path, 1, "--resume", log="resume.log").wait(timeout=300)
    assert done == 0, (tmp_path / "resume.log").read_text()
    assert _trial_processes(tmp_path) == []
    after = _study(tmp_path)
    assert {n: _completed(after).get(n) for n in completed} == completed
    if not after.trials[left[0]].user_attrs.get("adopted"):  # (unless it finished before the resume)
        assert _started_since(after, since)[0].params == left[1]


@pytest.mark.slow
@pytest.mark.dist(timeout=150)
def test_3_a_result_the_orphan_finished_is_kept(tmp_path):
    """Was: a finished result.json of the orphan was thrown away and the plan measured again."""
    proc = _start(tmp_path, 3)
    trial_dir = _running_trial(tmp_path, proc)
    _kill(proc, signal.SIGKILL)
    deadline = time.monotonic() + 240
    while not (trial_dir / "result.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)  # the orphan measures on, and rank 0 writes its result
    time.sleep(0.5)
    done = _start(tmp_path, 1, "--resume", log="resume.log").wait(timeout=300)
    assert done == 0, (tmp_path / "resume.log").read_text()
    orphan = _study(tmp_path).trials[int(trial_dir.name)]
    assert orphan.state is TrialState.COMPLETE and orphan.value > 0 and orphan.user_attrs["adopted"]
    assert _trial_processes(tmp_path) == []


@pytest.mark.slow
@pytest.mark.dist(timeout=420)
def test_fuzz_kill_at_random_points_then_resume(tmp_path):
    """SIGINT, SIGTERM and SIGKILL, in a random order, each at a random moment of a trial (or between
    trials); each stopped run is resumed by the next. Afterwards: no trial process anywhere, every trial
    completed before a kill still completed with the same value, and each plan a kill left to redo was the
    first one the next run started."""
    seed = int(os.environ.get("AUTOTUNE_FUZZ_SEED", time.time_ns() % 10_000))
    rng = random.Random(seed)
    why = f"AUTOTUNE_FUZZ_SEED={seed}"
    kills = [signal.SIGINT, signal.SIGTERM, signal.SIGKILL]
    rng.shuffle(kills)
    completed: dict[int, tuple[dict, float]] = {}
    pending: tuple[int, dict] | None = None
    pending_sig: signal.Signals | None = None
    for round_, sig in enumerate([*kills, None]):
        since, older = datetime.now(), _trial_dirs(tmp_path)
        proc = _start(tmp_path, 2, *(["--resume"] if round_ else []), log=f"run{round_}.log")
        if sig is None:
            assert proc.wait(timeout=300) == 0, (tmp_path / f"run{round_}.log").read_text()
        else:
            _running_trial(tmp_path, proc, older=older)  # a trial of this run (it ended the older orphans)
            time.sleep(rng.uniform(0.0, 4.0))  # early in the trial, mid-measurement, or after it
            _kill(proc, sig)
            if sig is not signal.SIGKILL:
                assert _gone_within(tmp_path, 10) == [], why
        study = _study(tmp_path)
        started = _started_since(study, since)
        if pending is not None and started and not study.trials[pending[0]].user_attrs.get("adopted"):
            redo = started[0].params
            if pending_sig is signal.SIGKILL:  # uncatchable: it may cut the plan's suggestion short, and the
                redo = {k: redo.get(k) for k in pending[1]}  # redo keeps the knobs chosen before it
            assert redo == pending[1], f"{why}: round {round_} began with another plan"
        for number, record in completed.items():
            assert _completed(study).get(number) == record, f"{why}: trial {number} lost after round {round_}"
        completed |= _completed(study)
        pending, pending_sig = _left_to_redo(study), sig
    assert _trial_processes(tmp_path) == [], why
    assert not [t for t in _study(tmp_path).trials if t.state is TrialState.RUNNING], why
