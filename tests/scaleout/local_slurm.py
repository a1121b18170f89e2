"""A real Slurm cluster on this machine for the tests: munged, slurmctld and two ``slurmd -N`` nodes.

Everything lives in one temporary directory (``slurm.conf``, the munge key and socket, state, spool, logs);
the daemons run in the foreground as children of the test session and are stopped by ``stop()``. The
nodes ``n1`` and ``n2`` are emulated on 127.0.0.1 (``NodeAddr``), each with this machine's CPUs, so a
2-node job runs two torchrun agents here. No cgroups: ``proctrack/linuxproc`` and ``task/none``.
Needs root (slurmd runs jobs as their user; munged runs as user ``munge``) and the Debian packages
``slurmctld slurmd slurm-client munge`` (``.ci/services/slurm.sh`` installs them).
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["BINARIES", "LocalSlurm", "missing_requirements"]

BINARIES = (
    "munged",
    "slurmctld",
    "slurmd",
    "sbatch",
    "srun",
    "salloc",
    "scontrol",
    "scancel",
    "squeue",
    "sinfo",
)
NODES = ("n1", "n2")


def missing_requirements() -> str | None:
    """Why a local Slurm cannot start here, or None."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return f"Slurm is not installed (no {', '.join(missing)}); .ci/services/slurm.sh installs it"
    if os.geteuid() != 0:
        return "starting slurmd and munged (as user munge) needs root"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "no 'munge' user (the munge package creates it)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalSlurm:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="autotune-slurm-"))
        self.root.chmod(0o755)  # munged (user munge) must reach its socket and key below
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._procs: list[subprocess.Popen] = []

    def _munge(self) -> list[str]:
        munge = self.root / "munge"
        munge.mkdir(mode=0o755)
        key = munge / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        for path in (munge, key):
            os.chown(path, pwd.getpwnam("munge").pw_uid, pwd.getpwnam("munge").pw_gid)
        return [
            "munged",
            "-F",
            f"--key-file={key}",
            f"--socket={munge / 'munge.sock'}",
            f"--pid-file={munge / 'munged.pid'}",
            f"--log-file={munge / 'munged.log'}",
            f"--seed-file={munge / 'munged.seed'}",
        ]

    def _write_conf(self) -> None:
        r, cpus = self.root, os.cpu_count() or 1
        for d in ("state", "spool"):
            (r / d).mkdir()
        lines = [
            "ClusterName=autotune",
            "SlurmctldHost=localhost",
            f"SlurmctldPort={_free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={r / 'munge' / 'munge.sock'}",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool' / '%n'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd.%n.pid'}",
            f"SlurmctldLogFile={r / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'slurmd.%n.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "ReturnToService=2",
            "KillWait=2",
            "InactiveLimit=0",
            # finished jobs are never purged: `sbatch --wait` then polls every 2 s instead of backing off to
            # 2 + 8 + 32 s (src/sbatch/sbatch.c `_job_wait` multiplies its sleep while it is under
            # MinJobAge / 2), and `scontrol show job` can always report a finished job
            "MinJobAge=0",
            *(
                f"NodeName={n} NodeAddr=127.0.0.1 Port={_free_port()} CPUs={cpus} State=UNKNOWN"
                for n in NODES
            ),
            f"PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def _spawn(self, argv: list[str], log: str, **kw) -> None:
        with (self.root / log).open("wb") as out:
            self._procs.append(
                subprocess.Popen(
                    argv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    **kw,
                )
            )

    def start(self, timeout_s: float = 30.0) -> None:
        munge_argv = self._munge()
        self._write_conf()
        self._spawn(munge_argv, "munged.out", user="munge", group="munge", extra_groups=[])
        sock = self.root / "munge" / "munge.sock"
        self._wait(sock.exists, timeout_s, "munged did not create its socket")
        self._spawn(["slurmctld", "-D", "-i"], "slurmctld.out")
        for node in NODES:
            self._spawn(["slurmd", "-D", "-N", node], f"slurmd.{node}.out")
        self._wait(self._idle, timeout_s, "the nodes did not become idle")

    def _idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.split()
        return all(n in out and out[out.index(n) + 1] == "idle" for n in NODES)

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self._procs):
                logs = "\n".join(
                    f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                    for p in sorted(self.root.glob("*.out"))
                )
                self.stop()
                raise RuntimeError(f"local Slurm: {what}\n{logs}")
            time.sleep(0.2)

    def run(
        self, *argv: str, check: bool = True, timeout: float = 60, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        """A Slurm command against this cluster (``env``: more variables)."""
        return subprocess.run(
            argv,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )

    def stop(self) -> None:
        """Cancel every job, wait for them to leave, then stop the daemons (SIGTERM, then SIGKILL)."""
        if self._procs and self._procs[0].poll() is None:
            self.run("scancel", "--user", "root", check=False)
            deadline = time.monotonic() + 20
            while self.run("squeue", "-h", check=False).stdout.strip() and time.monotonic() < deadline:
                time.sleep(0.2)
        for proc in reversed(self._procs):  # slurmd, slurmctld, then munged
            _signal(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _signal(proc, signal.SIGKILL)
                proc.wait()
        self._procs.clear()
        shutil.rmtree(self.root, ignore_errors=True)


def _signal(proc: subprocess.Popen, sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
