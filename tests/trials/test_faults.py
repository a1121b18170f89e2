"""Failed trials are classified from the worker's files and the exit path, and leave no process behind.

Faults are injected into the real worker (``AUTOTUNE_FAULT``, see ``autotune.trials.config``): a raised
exception, a raised ``torch.OutOfMemoryError`` (how an OOM is simulated on the CPU), a hard exit without
a result, a hang past the timeout; a rendezvous that never forms (one agent of two); the pruner stopping
a trial. After each, no process whose argv names the trial directory survives, and every worker pid
that wrote a ``started`` marker is gone.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from trial_helpers import make_request

from autotune.backends.torchrun import TorchrunBackend
from autotune.plan import ParallelPlan
from autotune.trials.config import FAULT_ENV
from autotune.trials.result import TrialStatus
from autotune.trials.runner import Launch, live_trial_pids, run_trial

PLAN = ParallelPlan(dp=2, global_batch=4, seq_len=32)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _assert_nothing_left(trial_dir: Path) -> None:
    assert live_trial_pids(trial_dir.resolve()) == []
    worker_pids = [int(p.read_text()) for p in trial_dir.glob("started.*")]
    assert not [pid for pid in worker_pids if _alive(pid)]


def _run_fault(tiny, tmp_path: Path, fault: str, plan: ParallelPlan = PLAN, **request_kw):
    backend = TorchrunBackend(device="cpu", launch=Launch(env={FAULT_ENV: fault}, grace_s=3.0))
    trial_dir = tmp_path / fault
    result = backend.run(make_request(tiny, plan, trial_dir, **request_kw))
    _assert_nothing_left(trial_dir)
    return result, trial_dir


@pytest.mark.dist(timeout=90)
def test_crash_is_an_error_with_the_stderr_tail(tiny, tmp_path):
    result, _ = _run_fault(tiny, tmp_path, "crash")
    assert result.status is TrialStatus.ERROR
    first_line, tail = result.error.split("\n", 1)
    assert first_line == "rank 1: RuntimeError: injected crash (AUTOTUNE_FAULT=crash) before step 1"
    assert "stderr tail" in tail and "Traceback" in (tmp_path / "crash" / "stderr.log").read_text()


@pytest.mark.dist(timeout=90)
def test_out_of_memory_is_oom(tiny, tmp_path):
    result, trial_dir = _run_fault(tiny, tmp_path, "oom")
    assert result.status is TrialStatus.OOM
    assert result.error.startswith("rank 1: OutOfMemoryError")
    assert (trial_dir / "result.rank1.json").exists()


@pytest.mark.dist(timeout=90)
def test_death_without_a_result_is_an_error(tiny, tmp_path):
    """One rank, so no peer reports a broken connection instead (with peers, their error is the result)."""
    result, trial_dir = _run_fault(tiny, tmp_path, "exit", plan=ParallelPlan(global_batch=2, seq_len=32))
    assert result.status is TrialStatus.ERROR
    assert result.error.startswith("workers died without a result (torchrun exit code 1)")
    assert not list(trial_dir.glob("result.rank*.json"))


@pytest.mark.dist(timeout=90)
def test_hang_past_the_deadline_is_a_timeout_and_the_group_is_killed(tiny, tmp_path):
    start = time.monotonic()
    result, _ = _run_fault(tiny, tmp_path, "hang", timeout_s=15.0)
    assert result.status is TrialStatus.TIMEOUT
    assert 15.0 <= result.wall_s < 15.0 + 3.0 + 5.0  # deadline + SIGTERM grace + slack
    assert time.monotonic() - start < 120  # a hang, not a slow start on a loaded machine


@pytest.mark.dist(timeout=90)
def test_lone_agent_is_a_rendezvous_error(tiny, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launch = Launch(nproc_per_node=1, nnodes=2, rdzv_endpoint=f"127.0.0.1:{port}", rdzv_conf="join_timeout=3")
    trial_dir = tmp_path / "rdzv"
    result = run_trial(make_request(tiny, PLAN, trial_dir, timeout_s=60), launch=launch)
    assert result.status is TrialStatus.RENDEZVOUS_ERROR
    assert result.error.startswith("no worker started")
    assert not list(trial_dir.glob("started.*"))
    _assert_nothing_left(trial_dir)


@pytest.mark.dist(timeout=90)
def test_pruner_stops_the_trial(tiny, tmp_path):
    seen: list[tuple[int, float]] = []

    def report(step: int, tokens_per_s: float) -> bool:
        seen.append((step, tokens_per_s))
        return True  # prune at the first measured step

    trial_dir = tmp_path / "pruned"
    request = make_request(tiny, PLAN, trial_dir, warmup_steps=1, measure_steps=200)
    result = TorchrunBackend(device="cpu").run(request, report=report)
    assert result.status is TrialStatus.PRUNED
    assert seen[0][0] == 0 and seen[0][1] > 0
    _assert_nothing_left(trial_dir)
