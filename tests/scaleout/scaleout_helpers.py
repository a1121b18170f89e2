"""Helpers of the scale-out tests: ``autotune`` as a real subprocess, and the study as its storage has it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from autotune.scaleout import open_storage

__all__ = [
    "SIMULATE_7B",
    "ELSEWHERE",
    "autotune",
    "spawn",
    "kill_9",
    "wait_for",
    "load",
    "launched",
    "states",
]

SIMULATE_7B = ["--model", "7b", "--gpus", "8", "--global-batch", "64", "--backend", "simulate"]
"""A study whose trials are the cost model's predictions: fast, deterministic, and large enough."""


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "AUTOTUNE_SLOWDOWN_MS"}
    return env | (extra or {})


def autotune(
    *argv: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m autotune ARGV`` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "autotune", *argv],
        cwd=cwd,
        env=_env(env),
        text=True,
        capture_output=True,
        timeout=timeout,
    )


ELSEWHERE = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
"""Run as if on another node: in its own PID namespace its pids mean nothing to the other workers, so only
its heartbeat can tell them it died (on one host a dead worker's trial is recognised at once)."""


def spawn(
    *argv: str, cwd: Path, log: Path, env: dict[str, str] | None = None, elsewhere: bool = False
) -> subprocess.Popen[bytes]:
    """Start ``python -m autotune ARGV`` in its own session (so a SIGKILL reaches all of it)."""
    if elsewhere and (os.geteuid() != 0 or not shutil.which("unshare")):
        pytest.skip("a worker 'on another node' needs unshare --pid as root")
    prefix = ELSEWHERE if elsewhere else []
    out = log.open("wb")
    return subprocess.Popen(
        [*prefix, sys.executable, "-m", "autotune", *argv],
        cwd=cwd,
        env=_env(env),
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def kill_9(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def wait_for(what: str, check: Callable[[], Any], timeout: float, procs: list[Any] = ()) -> Any:
    """Poll ``check`` until it returns something truthy; fail (naming ``what``) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        dead = [p for p in procs if p.poll() is not None]
        assert not dead, f"waiting for {what}: process {dead[0].args} exited {dead[0].returncode}"
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def load(name: str, url: str) -> optuna.Study:
    """The study, read afresh from its storage (no heartbeat: this process runs no trial)."""
    return optuna.load_study(study_name=name, storage=open_storage(url, heartbeat_s=None))


def launched(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Trials that ran a plan (not infeasible proposals, nor re-told duplicates)."""
    return [
        t
        for t in study.get_trials()
        if t.state is TrialState.COMPLETE
        and t.user_attrs.get("status") == "ok"
        and "duplicate_of" not in t.user_attrs
    ]


def states(study: optuna.Study) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in study.get_trials():
        counts[t.state.name] = counts.get(t.state.name, 0) + 1
    return counts
