"""``slurm``: a trial's torchrun agents as Slurm tasks, one per node (``srun --ntasks-per-node 1``).

Two modes; ``auto`` takes ``steps`` inside an allocation (``SLURM_JOB_ID`` set) and ``jobs`` elsewhere:

* ``jobs``: every trial is its own ``sbatch`` job (``--nodes``, ``--time`` = the trial timeout rounded up to
  whole minutes, ``--output``/``--error`` into the trial directory, ``--exclusive``, ``--gpus-per-node`` for
  GPU trials) whose script runs ``srun torchrun``. For many short trials of different sizes on a shared
  cluster: each queues for just the nodes it needs, and a trial that crashes or leaks takes only its job
  down. Each trial waits in the queue; that wait is not counted against its timeout.
* ``steps``: every trial is an ``srun --nodes K --nodelist <first K nodes>`` step inside the allocation that
  runs autotune (``salloc``, or an ``sbatch`` of ``autotune search``). No queue wait between trials and the
  same nodes each time; the allocation must fit the largest trial and is paid for while smaller ones run.

Slurm's environment, mapped to torchrun's: the rendezvous host is the first of
``scontrol show hostnames $SLURM_JOB_NODELIST`` (of the step's nodes), reached at its ``NodeAddr``; the
task with ``SLURM_NODEID`` 0 (= ``SLURM_PROCID`` with one task per node) serves the c10d store
(``--rdzv_conf is_host=1``) and the others join it, so no hostname matching is involved; torchrun numbers
the nodes as they join. The port is ``AUTOTUNE_RDZV_PORT``, else derived from the job (and step) id.
Partition, account and QOS come from Slurm's own ``SBATCH_PARTITION``/``SBATCH_ACCOUNT``/``SBATCH_QOS``.

Status as for local trials (``autotune.trials.runner``), from the worker's files and how the job ended,
never from its logs: ``result.json``; a rank's ``oom``/``error``; ``timeout`` when the job runs past the
trial timeout (autotune ``scancel``s it) or Slurm ended it ``TIMEOUT``; ``rendezvous_error`` when no worker
started. A job that never ran (cancelled while queued, ``NODE_FAIL``, ...) is an ``error`` naming its state.
Job state comes from ``scontrol show job`` (it reports ``COMPLETING`` too). The Python interpreter and the
trial directory must be at the same path on every node (a shared file system).
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import time
import zlib
from collections.abc import Mapping
from pathlib import Path

from autotune.emit.command import ShellRef, shell_join, torchrun_command, worker_entry
from autotune.executors.multinode import node_layout
from autotune.executors.slurmctl import (
    ACTIVE,
    WAITING,
    cancel_job,
    cancel_steps,
    exit_code,
    hostnames,
    job_fields,
    job_result,
    node_address,
)
from autotune.trials.config import TrialConfig
from autotune.trials.request import ReportFn, TrialRequest
from autotune.trials.result import TrialResult, TrialStatus
from autotune.trials.runner import Launch, _environment, _prepare, _Progress, run_commands

__all__ = [
    "MODES",
    "SlurmExecutor",
    "srun_command",
    "job_script",
    "time_limit_minutes",
]

MODES = ("auto", "jobs", "steps")
_IS_HOST = "is_host=$((SLURM_NODEID == 0))"
"""Expanded by each task's shell: node 0 of the job (or step) serves the c10d store."""
_PORT = "${AUTOTUNE_RDZV_PORT:-$((20000 + SLURM_JOB_ID % 20000))}"
_LOST_S = 60.0
"""How long ``scontrol`` may fail to report a job before the trial gives up on it."""


def time_limit_minutes(timeout_s: float) -> int:
    """``sbatch --time``: Slurm limits are whole minutes."""
    return max(1, math.ceil(timeout_s / 60))


def srun_command(
    trial_dir: Path,
    *,
    nnodes: int,
    nproc: int,
    rdzv_endpoint: str,
    rdzv_id: str,
    join_timeout_s: int,
    python: str,
    srun_options: tuple[str, ...] = (),
) -> list[str]:
    """``srun`` one torchrun agent per node; each task's shell sets ``is_host`` from ``SLURM_NODEID``."""
    agent = torchrun_command(
        program=(python, "-m", "torch.distributed.run"),
        nnodes=nnodes,
        nproc_per_node=nproc,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_id=rdzv_id,
        rdzv_conf=ShellRef(f"join_timeout={join_timeout_s},{_IS_HOST}"),
        entry=worker_entry(str(trial_dir)),
    )
    return [
        "srun",
        f"--nodes={nnodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        *srun_options,
        "bash",
        "-c",
        "exec " + shell_join(agent),
    ]


def job_script(srun: list[str]) -> str:
    """The batch script of a job-per-trial: find the rendezvous host, then ``srun`` the agents."""
    return "\n".join(
        [
            "#!/bin/bash",
            "# autotune trial: one torchrun agent per node; node 0 (the job's first) serves the rendezvous.",
            "set -eu",
            """HEAD="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | awk 'NR == 1')\"""",
            """HEAD_ADDR="$(scontrol show node -o "$HEAD" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')\"""",
            f'export AUTOTUNE_RDZV_ENDPOINT="${{HEAD_ADDR:-$HEAD}}:{_PORT}"',
            "exec " + shell_join(srun),
            "",
        ]
    )


class SlurmExecutor:
    name = "slurm"

    def __init__(
        self,
        *,
        mode: str = "auto",
        launch: Launch | None = None,
        join_timeout_s: float = 60.0,
        exclusive: bool = True,
        queue_timeout_s: float | None = None,
        poll_s: float = 0.5,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``launch``: the interpreter, extra worker environment and stop grace (as for local trials);
        ``queue_timeout_s``: cancel a job still queued after this long (None: wait); ``env``: where to read
        ``SLURM_*`` from (default ``os.environ``, read at each trial)."""
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {MODES}")
        self.mode, self.launch, self.join_timeout_s = mode, launch or Launch(), join_timeout_s
        self.exclusive, self.queue_timeout_s, self.poll_s, self._env = exclusive, queue_timeout_s, poll_s, env

    @property
    def env(self) -> Mapping[str, str]:
        return os.environ if self._env is None else self._env

    def run(
        self, request: TrialRequest, *, config: TrialConfig, report: ReportFn | None = None
    ) -> TrialResult:
        layout = node_layout(request, None)
        if isinstance(layout, str):
            return TrialResult(status=TrialStatus.ERROR, error=layout, wall_s=0.0)
        steps = self.mode == "steps" or (self.mode == "auto" and "SLURM_JOB_ID" in self.env)
        run = self._run_step if steps else self._run_job
        return run(request, config, report, *layout)

    def _options(self, config: TrialConfig, request: TrialRequest) -> list[str]:
        gpus = request.cluster.gpus_per_node
        return [] if config.device == "cpu" else [f"--gpus-per-node={gpus}"]

    def _join_s(self, request: TrialRequest) -> int:
        return max(1, int(min(self.join_timeout_s, request.timeout_s)))

    # -- steps inside the current allocation -------------------------------------------------------------

    def _run_step(
        self, request: TrialRequest, config: TrialConfig, report: ReportFn | None, nnodes: int, nproc: int
    ) -> TrialResult:
        trial_dir = request.trial_dir.resolve()
        job_id = self.env["SLURM_JOB_ID"]
        nodes = hostnames(self.env.get("SLURM_JOB_NODELIST", ""))
        if nnodes > len(nodes):
            error = f"the trial needs {nnodes} node(s); allocation {job_id} has {len(nodes)}"
            return TrialResult(status=TrialStatus.ERROR, error=error, wall_s=0.0)
        nodes = nodes[:nnodes]
        derived = 20000 + zlib.crc32(f"{job_id}/{trial_dir}".encode()) % 20000  # as the job script's port
        port = self.env.get("AUTOTUNE_RDZV_PORT") or derived
        name = f"autotune-{trial_dir.name}"
        options = [f"--nodelist={','.join(nodes)}", f"--job-name={name}", *self._options(config, request)]
        if "SLURM_CPUS_ON_NODE" in self.env:
            options.append(f"--cpus-per-task={self.env['SLURM_CPUS_ON_NODE']}")
        cmd = srun_command(
            trial_dir,
            nnodes=nnodes,
            nproc=nproc,
            python=self.launch.python,
            rdzv_endpoint=f"{node_address(nodes[0])}:{port}",
            rdzv_id=f"{job_id}-{name}",
            join_timeout_s=self._join_s(request),
            srun_options=tuple(options),
        )
        return run_commands(
            request,
            [cmd],
            config=config,
            launch=self.launch,
            nproc=nproc,
            report=report,
            cancel=lambda: cancel_steps(job_id, name),
        )

    # -- one sbatch job per trial --------------------------------------------------------------------------

    def _run_job(
        self, request: TrialRequest, config: TrialConfig, report: ReportFn | None, nnodes: int, nproc: int
    ) -> TrialResult:
        trial_dir = request.trial_dir.resolve()
        script = trial_dir / "job.sbatch"
        sbatch = [
            "sbatch",
            "--parsable",
            f"--job-name=autotune-{trial_dir.name}",
            f"--nodes={nnodes}",
            "--ntasks-per-node=1",
            f"--time={time_limit_minutes(request.timeout_s)}",
            f"--output={trial_dir / 'stdout.log'}",
            f"--error={trial_dir / 'stderr.log'}",
            f"--chdir={trial_dir}",
            *(["--exclusive"] if self.exclusive else []),
            *self._options(config, request),
            str(script),
        ]
        srun = srun_command(
            trial_dir,
            nnodes=nnodes,
            nproc=nproc,
            python=self.launch.python,
            rdzv_endpoint=ShellRef("$AUTOTUNE_RDZV_ENDPOINT"),
            rdzv_id=ShellRef("$SLURM_JOB_ID"),
            join_timeout_s=self._join_s(request),
            srun_options=(ShellRef("--cpus-per-task=$SLURM_CPUS_ON_NODE"), *self._options(config, request)),
        )
        _prepare(trial_dir, request, config, [sbatch])
        script.write_text(job_script(srun))
        launched_at = time.time()
        done = subprocess.run(
            sbatch,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=60,
            cwd=trial_dir,
            env=_environment(config, nproc, self.launch),
        )
        if done.returncode:
            error = f"sbatch refused the trial: {done.stderr.strip() or done.stdout.strip()}"
            return _finish(
                trial_dir,
                TrialResult(status=TrialStatus.ERROR, error=error),
                wall_s=0.0,
                extra={"exit_code": done.returncode, "launched_at": launched_at},
            )
        job_id = done.stdout.strip().split(";")[0]
        progress = _Progress(trial_dir / "progress.jsonl", report)
        submitted, stop, started = time.monotonic(), None, None
        fields: dict[str, str] = {}
        try:
            fields, stop, started = self._watch(job_id, request.timeout_s, progress)
        finally:
            if fields.get("JobState", "PENDING") in ACTIVE:  # stopped by autotune, or interrupted
                fields = cancel_job(job_id, self.poll_s) or {**fields, "JobState": "CANCELLED"}
        end = time.monotonic()
        progress.poll()
        result = job_result(
            trial_dir,
            job_id,
            fields,
            stop,
            ran=started is not None,
            timeout_s=request.timeout_s,
            queue_timeout_s=self.queue_timeout_s,
        )
        slurm = {
            "job_id": job_id,
            "state": fields.get("JobState"),
            "nodes": fields.get("NodeList"),
            "queue_wait_s": (started or end) - submitted,
        }
        return _finish(
            trial_dir,
            result,
            wall_s=end - (started or end),
            extra={
                "exit_code": exit_code(fields),
                "launched_at": launched_at,
                "progress": progress.steps,
                "slurm": slurm,
            },
        )

    def _watch(
        self, job_id: str, timeout_s: float, progress: _Progress
    ) -> tuple[dict[str, str], str | None, float | None]:
        """Follow the job until it ends or autotune must stop it: ``(scontrol fields, why stopped, when it
        started running)``; ``why`` is ``timeout`` | ``pruned`` | ``queue`` | None (it ended by itself)."""
        submitted = last_seen = time.monotonic()
        fields: dict[str, str] = {"JobState": "PENDING"}
        started: float | None = None
        while True:
            now = time.monotonic()
            seen = job_fields(job_id)
            if seen is not None:
                fields, last_seen = seen, now
            elif now - last_seen > _LOST_S:
                return fields | {"JobState": "LOST"}, None, started
            state = fields.get("JobState", "")
            if started is None and state not in WAITING:
                started = now
            if state not in ACTIVE:
                return fields, None, started
            if started is not None:
                if progress.poll():
                    return fields, "pruned", started
                if now - started > timeout_s:
                    return fields, "timeout", started
            elif self.queue_timeout_s is not None and now - submitted > self.queue_timeout_s:
                return fields, "queue", started
            time.sleep(self.poll_s)


def _finish(trial_dir: Path, result: TrialResult, *, wall_s: float, extra: dict[str, object]) -> TrialResult:
    result = dataclasses.replace(result, wall_s=wall_s, extra=dict(result.extra or {}) | extra)
    result.write(trial_dir / "result.json")
    return result
