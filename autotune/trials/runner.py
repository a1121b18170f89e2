"""Launch one trial as a ``torchrun`` subprocess and turn how it ended into a ``TrialResult``.

The trial directory layout is in ``autotune.trials.config``. The status comes from the files the worker
writes and from the exit path, never from the logs:

* ``result.json`` from rank 0                      -> its status (normally ``ok``)
* a rank's ``result.rank<r>.json``                 -> ``oom`` if any rank ran out of memory, else the
                                                      status of the rank that failed first
* no result and the deadline passed                -> ``timeout``
* the pruner asked to stop                         -> ``pruned``
* no worker ever started (no ``started.<r>``)       -> ``rendezvous_error`` (the agents never formed a group)
* workers started, then died without a result      -> ``error`` (signal or exit code)

Every ``error`` carries the tail of ``stderr.log``. torchrun runs in its own session; its workers run
in sessions of their own (torch.distributed.elastic starts them with ``start_new_session``), so
stopping a trial signals torchrun's group (SIGTERM, then SIGKILL after a grace period) and then every
worker that wrote a ``started`` marker. Workers also die with their agent (``PR_SET_PDEATHSIG``).

``run_commands`` supervises several agents of one trial the same way (``autotune.executors``: N agents of
a multi-node trial on this machine, or an ``srun`` step); the first agent to fail stops the others.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.catalog import load_gpu
from autotune.emit.command import torchrun_command, worker_entry
from autotune.interrupt import held
from autotune.trials.config import TrialConfig
from autotune.trials.cpu import cpu_share
from autotune.trials.orphans import live_trial_pids, record_agents
from autotune.trials.request import ReportFn, TrialRequest
from autotune.trials.result import TrialResult, TrialStatus

__all__ = ["Launch", "trial_config", "launch_command", "run_trial", "run_commands", "live_trial_pids"]

_REPO_ROOT = Path(__file__).resolve().parents[2]
_STALE = ("result.json", "progress.jsonl", "result.rank*.json", "started.*", "joined.*", "agents.json")
# How often this process and torchrun's agent wake up during a trial. Each wake-up takes a core from a rank
# for a moment, and a 2-core CPU node runs two ranks: 0.05 s here and torchrun's default 0.1 s added a few
# percent of noise to CPU step times. A quarter second still ends a trial or a pruned trial promptly.
_POLL_S = 0.25
_MONITOR_INTERVAL_S = "0.5"
_TAIL = "\n--- stderr tail ---\n"


@dataclass(frozen=True, kw_only=True, slots=True)
class Launch:
    """How torchrun is started: one node with ``--standalone`` (a free port), or one agent of several."""

    nproc_per_node: int | None = None
    """Workers on this node (default: the plan's world size / nnodes)."""
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    """``host:port`` of the c10d rendezvous; None with one node means ``--standalone``."""
    rdzv_id: str = "autotune"
    rdzv_conf: str | None = None
    """torchrun ``--rdzv-conf``, e.g. ``join_timeout=60``."""
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for the workers (tests inject faults here)."""
    grace_s: float = 5.0
    """SIGTERM -> SIGKILL delay when a trial is stopped."""


def trial_config(request: TrialRequest, *, device: str | None = None, **overrides: object) -> TrialConfig:
    """The worker's ``trial.json`` for a request: model, steps, the catalog peak for MFU.

    ``device``: ``cpu`` | ``cuda`` | None (CPU when the cluster's GPU is the catalog's ``cpu``, else auto).
    On the CPU, MFU is against the catalog ``cpu`` entry's fp32 peak, whatever cluster was planned.
    """
    on_cpu = device == "cpu" or (device is None and request.cluster.gpu.key == "cpu")
    gpu = load_gpu("cpu") if on_cpu else request.cluster.gpu
    peak = gpu.peak_flops("fp32" if on_cpu else str(request.plan.precision))
    kwargs: dict[str, object] = {
        "model": request.model,
        "warmup_steps": request.warmup_steps,
        "measure_steps": request.measure_steps,
        "peak_flops_per_gpu": peak,
        "device": "cpu" if on_cpu else (device or "auto"),
    }
    return TrialConfig(**(kwargs | overrides))  # type: ignore[arg-type]


def launch_command(trial_dir: Path, *, nproc: int, launch: Launch) -> list[str]:
    """One torchrun agent, built by ``torchrun_command`` like the emitted launch scripts."""
    standalone = launch.nnodes == 1 and launch.rdzv_endpoint is None
    return torchrun_command(
        program=(launch.python, "-m", "torch.distributed.run"),
        nnodes=launch.nnodes,
        nproc_per_node=nproc,
        standalone=standalone,
        rdzv_endpoint=launch.rdzv_endpoint,
        rdzv_id=None if standalone else launch.rdzv_id,
        rdzv_conf=launch.rdzv_conf,
        node_rank=None if standalone else launch.node_rank,
        entry=worker_entry(str(trial_dir)),
    )


def _environment(config: TrialConfig, nproc: int, launch: Launch) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), env.get("PYTHONPATH")) if p)
    cores = len(os.sched_getaffinity(0))
    env.setdefault("OMP_NUM_THREADS", str(cpu_share(cores, nproc, single_node=launch.nnodes == 1)[0]))
    env.setdefault("PET_MONITOR_INTERVAL", _MONITOR_INTERVAL_S)  # torchrun --monitor-interval (see _POLL_S)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(_REPO_ROOT / ".torch_extensions"))
    if config.device == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
    return env | launch.env


def _prepare(trial_dir: Path, request: TrialRequest, config: TrialConfig, cmds: list[list[str]]) -> None:
    trial_dir.mkdir(parents=True, exist_ok=True)
    for pattern in _STALE:
        for stale in trial_dir.glob(pattern):
            stale.unlink()
    (trial_dir / "plan.json").write_text(json.dumps(request.plan.to_dict(), indent=2) + "\n")
    config.write(trial_dir / "trial.json")
    (trial_dir / "cmd.txt").write_text("".join(shlex.join(cmd) + "\n" for cmd in cmds))


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop(procs: list[subprocess.Popen], trial_dir: Path, grace_s: float) -> None:
    """SIGTERM each torchrun's group (it forwards to its workers), SIGKILL after ``grace_s``, then any
    worker still alive (each leads its own session), then reap."""
    for proc in procs:
        _signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
    _reap_workers(trial_dir)


def _reap_workers(trial_dir: Path, wait_s: float = 5.0) -> None:
    for pid in live_trial_pids(trial_dir):
        _signal_group(pid, signal.SIGKILL)
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + wait_s
    while live_trial_pids(trial_dir) and time.monotonic() < deadline:
        time.sleep(_POLL_S)


class _Progress:
    """Tails ``progress.jsonl`` and forwards each measured step to ``report``."""

    def __init__(self, path: Path, report: ReportFn | None) -> None:
        self.path, self.report, self.offset = path, report, 0
        self.steps: list[dict[str, Any]] = []

    def poll(self) -> bool:
        """Forward new steps; True when the pruner asks to stop."""
        if not self.path.exists():
            return False
        with self.path.open() as f:
            f.seek(self.offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind("\n") + 1]
        self.offset += len(complete)
        for line in complete.splitlines():
            rec = json.loads(line)
            self.steps.append(rec)
            if self.report is not None and self.report(int(rec["step"]), float(rec["tokens_per_s"])):
                return True
        return False


def _stderr_tail(trial_dir: Path, lines: int = 15) -> str:
    try:
        text = (trial_dir / "stderr.log").read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _rank_failure(trial_dir: Path) -> TrialResult | None:
    """OOM anywhere wins (peers then fail on broken connections); else the first rank to fail."""
    files = sorted(trial_dir.glob("result.rank*.json"), key=lambda p: (p.stat().st_mtime_ns, p.name))
    results = [TrialResult.read(p) for p in files]
    oom = [r for r in results if r.status is TrialStatus.OOM]
    return next(iter(oom or results), None)


def _classify(
    trial_dir: Path, returncode: int, *, timed_out: bool, pruned: bool, timeout_s: float
) -> TrialResult:
    final = trial_dir / "result.json"
    if final.exists():
        return TrialResult.read(final)
    if pruned:
        return TrialResult(status=TrialStatus.PRUNED, error="stopped by the pruner")
    if timed_out:
        return TrialResult(
            status=TrialStatus.TIMEOUT, error=f"no result after {timeout_s:g} s; process group killed"
        )
    failed = _rank_failure(trial_dir)
    tail = _stderr_tail(trial_dir)
    if failed is not None:
        return TrialResult(status=failed.status, error=f"{failed.error}{_TAIL}{tail}")
    if not any(trial_dir.glob("started.*")):
        return TrialResult(
            status=TrialStatus.RENDEZVOUS_ERROR,
            error=f"no worker started; torchrun exited {returncode}{_TAIL}{tail}",
        )
    how = f"signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
    return TrialResult(
        status=TrialStatus.ERROR, error=f"workers died without a result (torchrun {how}){_TAIL}{tail}"
    )


def run_trial(
    request: TrialRequest,
    *,
    report: ReportFn | None = None,
    launch: Launch | None = None,
    config: TrialConfig | None = None,
) -> TrialResult:
    """Run ``request`` under torchrun in ``request.trial_dir``; never raises for a failed trial."""
    launch = launch or Launch()
    config = config or trial_config(request)
    nproc = launch.nproc_per_node or request.plan.world_size // launch.nnodes
    cmd = launch_command(request.trial_dir.resolve(), nproc=nproc, launch=launch)
    return run_commands(request, [cmd], config=config, launch=launch, nproc=nproc, report=report)


def _settled(procs: list[subprocess.Popen]) -> bool:
    """Every agent exited, or one failed (its peers would only wait for it)."""
    codes = [p.poll() for p in procs]
    return all(c is not None for c in codes) or any(c not in (None, 0) for c in codes)


def run_commands(
    request: TrialRequest,
    commands: list[list[str]],
    *,
    config: TrialConfig,
    launch: Launch,
    nproc: int,
    report: ReportFn | None = None,
    cancel: Callable[[], None] | None = None,
) -> TrialResult:
    """Run the agents of one trial here (``launch_command`` lines, or an ``srun`` wrapping one), each in its
    own session, with the environment of ``launch`` for ``nproc`` local workers; ``cancel`` runs first when
    the trial stops (e.g. ``scancel`` of its Slurm step). Never raises for a failed trial."""
    trial_dir = request.trial_dir.resolve()
    _prepare(trial_dir, request, config, commands)
    progress = _Progress(trial_dir / "progress.jsonl", report)
    start, launched_at = time.monotonic(), time.time()
    procs: list[subprocess.Popen] = []
    with (trial_dir / "stdout.log").open("wb") as out, (trial_dir / "stderr.log").open("wb") as err:
        timed_out = pruned = False
        try:
            env = _environment(config, nproc, launch)
            with held():  # a stop signal now is raised once every agent is in procs (stopped below)
                for cmd in commands:
                    procs.append(
                        subprocess.Popen(
                            cmd,
                            cwd=trial_dir,
                            stdout=out,
                            stderr=err,
                            env=env,
                            stdin=subprocess.DEVNULL,
                            start_new_session=True,
                        )
                    )
                record_agents(trial_dir, [p.pid for p in procs])  # a resume after a SIGKILL ends them
            while not _settled(procs):
                pruned = progress.poll()
                timed_out = time.monotonic() - start > request.timeout_s
                if pruned or timed_out:
                    break
                time.sleep(_POLL_S)
        finally:
            if cancel is not None:
                cancel()
            _stop(procs, trial_dir, launch.grace_s)  # also after a normal exit: no worker outlives its trial
    wall_s = time.monotonic() - start
    progress.poll()
    returncode = next((p.returncode for p in procs if p.returncode), 0)
    result = _classify(trial_dir, returncode, timed_out=timed_out, pruned=pruned, timeout_s=request.timeout_s)
    extra = dict(result.extra or {}) | {
        "exit_code": returncode,
        "launched_at": launched_at,
        "progress": progress.steps,
    }
    result = dataclasses.replace(result, wall_s=wall_s, extra=extra)
    result.write(trial_dir / "result.json")
    return result
