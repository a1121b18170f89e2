"""Asking Slurm about a trial's job: ``scontrol``, ``scancel`` and ``squeue`` as the ``slurm`` executor uses
them, the job states that mean "still queued" or "still running", and how an ended job becomes a
``TrialResult`` (from the worker's files and the job's state, never from its logs).
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from autotune.trials.result import TrialResult, TrialStatus
from autotune.trials.runner import _classify

__all__ = [
    "ACTIVE",
    "WAITING",
    "cancel_job",
    "cancel_steps",
    "exit_code",
    "hostnames",
    "job_fields",
    "job_result",
    "node_address",
]

WAITING = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
ACTIVE = WAITING | {"RUNNING", "COMPLETING", "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"}


def _slurm(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)


def _fields(text: str) -> dict[str, str]:
    """The ``Key=Value`` words of ``scontrol -o`` output (a value with spaces keeps its first word)."""
    return dict(word.split("=", 1) for word in text.split() if "=" in word)


def hostnames(nodelist: str) -> list[str]:
    """``scontrol show hostnames``: ``n[1-2]`` -> ``["n1", "n2"]``."""
    return str(_slurm("scontrol", "show", "hostnames", nodelist).stdout).split()


def node_address(node: str) -> str:
    """The node's ``NodeAddr`` (how Slurm reaches it; usually its hostname), else its name."""
    return _fields(_slurm("scontrol", "show", "node", "-o", node).stdout).get("NodeAddr") or node


def job_fields(job_id: str) -> dict[str, str] | None:
    """``scontrol show job``'s fields; None when it cannot say (purged after MinJobAge, or no answer)."""
    done = _slurm("scontrol", "show", "job", "-o", job_id)
    return _fields(done.stdout) if done.returncode == 0 and "JobState=" in done.stdout else None


def cancel_job(job_id: str, poll_s: float, wait_s: float = 120.0) -> dict[str, str] | None:
    """``scancel`` and wait until Slurm has stopped the job's processes (it leaves ``COMPLETING``); None when
    Slurm purged the record before a poll saw it end (``MinJobAge`` shorter than the poll): the job was
    running when ``scancel`` ran and is gone, which the caller records as ``CANCELLED``."""
    _slurm("scancel", job_id)
    deadline, fields = time.monotonic() + wait_s, None
    while time.monotonic() < deadline:
        fields = job_fields(job_id)
        if fields is None or fields.get("JobState") not in ACTIVE:
            break
        time.sleep(poll_s)
    return fields


def cancel_steps(job_id: str, name: str) -> None:
    """``scancel`` the trial's step (found by its name) in allocation ``job_id``; nothing once it ended."""
    listing = _slurm("squeue", "-h", "-s", "-j", job_id, "-o", "%i %j").stdout
    for line in listing.splitlines():
        step, _, step_name = line.partition(" ")
        if step_name == name:
            _slurm("scancel", step)


def exit_code(fields: Mapping[str, str]) -> int:
    """``ExitCode=code:signal`` of the batch script as a Popen return code (``-signal`` when signalled)."""
    code, _, sig = fields.get("ExitCode", "0:0").partition(":")
    if sig.isdigit() and int(sig):
        return -int(sig)
    return int(code) if code.isdigit() else 1


def job_result(
    trial_dir: Path,
    job_id: str,
    fields: Mapping[str, str],
    stop: str | None,
    *,
    ran: bool,
    timeout_s: float,
    queue_timeout_s: float | None,
) -> TrialResult:
    state, reason = fields.get("JobState", "UNKNOWN"), fields.get("Reason", "None")
    ran = ran or fields.get("NodeList", "(null)") not in ("", "(null)")
    has_result = (trial_dir / "result.json").exists()
    if stop == "queue":
        return TrialResult(
            status=TrialStatus.ERROR,
            error=f"slurm job {job_id} still queued after {queue_timeout_s:g} s (Reason={reason}); cancelled",
        )
    if not ran and not has_result:
        return TrialResult(
            status=TrialStatus.ERROR,
            error=f"slurm job {job_id} ended {state} without running (Reason={reason})",
        )
    if state == "OUT_OF_MEMORY" and not has_result and not any(trial_dir.glob("result.rank*.json")):
        return TrialResult(status=TrialStatus.OOM, error=f"slurm job {job_id} ended OUT_OF_MEMORY")
    timed_out = stop == "timeout" or state == "TIMEOUT"
    result = _classify(
        trial_dir, exit_code(fields), timed_out=timed_out, pruned=stop == "pruned", timeout_s=timeout_s
    )
    if result.status is TrialStatus.TIMEOUT and not has_result:
        how = "cancelled (scancel)" if stop == "timeout" else "ended by Slurm's time limit"
        error = f"no result after {timeout_s:g} s; slurm job {job_id} {how}"
        result = dataclasses.replace(result, error=error)
    return result
