"""A trial's processes outlive a search killed with SIGKILL: find them again and end them.

``run_commands`` records each torchrun agent it starts in ``<trial>/agents.json``: host and PID namespace,
pid (also its process group and session: agents start with ``start_new_session``) and the process's start
time (``/proc/<pid>/stat`` field 22, as ``autotune.scaleout`` identifies a trial's owner), so a pid reused
by another process is never signalled. The workers lead sessions of their own (torchrun starts them so);
they are found by the ``--trial-dir <trial>`` in their argv (``live_trial_pids``) and die with their agent
too (``PR_SET_PDEATHSIG``). ``end_orphans`` is what ``--resume`` runs for a trial whose search died.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

__all__ = ["AGENTS_FILE", "start_ticks", "this_host", "record_agents", "live_trial_pids", "end_orphans"]

AGENTS_FILE = "agents.json"
_POLL_S = 0.1


def start_ticks(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot); None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def this_host() -> str:
    """This host and PID namespace: only there does a pid name the same process."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = "?"
    return f"{socket.gethostname()}/{namespace}"


def record_agents(trial_dir: Path, pids: list[int]) -> None:
    """Write ``agents.json`` for the agents just started (before the trial can outlive this process)."""
    agents = [{"host": this_host(), "pid": pid, "start": start_ticks(pid)} for pid in pids]
    tmp = trial_dir / f".{AGENTS_FILE}.tmp"
    tmp.write_text(json.dumps(agents) + "\n")
    tmp.replace(trial_dir / AGENTS_FILE)


def live_trial_pids(trial_dir: Path) -> list[int]:
    """Processes launched for this trial: ``--trial-dir <trial_dir>`` in their argv (torchrun, workers)."""
    needle = b"\0--trial-dir\0" + str(trial_dir).encode() + b"\0"
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in cmdline and state != "Z":
            pids.append(int(entry.name))
    return pids


def _recorded_agents(trial_dir: Path) -> list[int]:
    """The pids of ``agents.json`` that still name the processes it recorded (same host, same start)."""
    try:
        agents = json.loads((trial_dir / AGENTS_FILE).read_text())
    except (OSError, ValueError):
        return []
    host = this_host()
    return [
        a["pid"]
        for a in agents
        if a.get("host") == host and a.get("start") is not None and start_ticks(a["pid"]) == a["start"]
    ]


def _signal(pid: int, sig: signal.Signals, *, group: bool) -> None:
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def end_orphans(trial_dir: Path, grace_s: float = 5.0) -> list[int]:
    """End what is left of a trial whose supervisor died: SIGTERM each recorded agent's process group
    (torchrun then stops its workers), SIGKILL after ``grace_s``, then every process still naming the
    trial directory. Returns the pids found alive. Only for a trial nobody supervises any more."""
    trial_dir = trial_dir.resolve()
    agents = _recorded_agents(trial_dir)
    found = sorted(set(agents) | set(live_trial_pids(trial_dir)))
    for pid in agents:
        _signal(pid, signal.SIGTERM, group=True)
    deadline = time.monotonic() + grace_s
    while any(_running(p) for p in agents) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    for pid in [*agents, *live_trial_pids(trial_dir)]:
        _signal(pid, signal.SIGKILL, group=True)
        _signal(pid, signal.SIGKILL, group=False)
    deadline = time.monotonic() + grace_s
    while live_trial_pids(trial_dir) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    return found
