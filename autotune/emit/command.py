"""The one place a ``torchrun`` command line is built: trials (local, several agents, Slurm) and the emitted
``launch_torchrun.sh`` / ``launch_slurm.sbatch`` all call ``torchrun_command``.

Torch-free and pure. Flags use torchrun's underscore spelling (``--nproc_per_node``), which every
torch >= 2.0 accepts. A word the shell must expand when the script runs (``"$MASTER_ADDR:$MASTER_PORT"``,
``"${ENTRY[@]}"``) is a ``ShellRef``; ``shell_join`` leaves it in double quotes and quotes every other word.

With the c10d rendezvous torchrun assigns node ranks itself (in the order agents join; ``--node_rank`` is
only read by the ``static`` backend), and the agent whose host matches the endpoint serves the store.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

__all__ = ["WORKER_MODULE", "ShellRef", "shell_join", "torchrun_command", "worker_entry"]

WORKER_MODULE = "autotune.trials.worker"


class ShellRef(str):
    """A word expanded by the shell at launch time; ``shell_join`` writes it as ``"<word>"``."""

    __slots__ = ()


def shell_join(argv: Sequence[str]) -> str:
    """One shell line: ``ShellRef`` words double-quoted as they are, every other word ``shlex.quote``d."""
    return " ".join(f'"{w}"' if isinstance(w, ShellRef) else shlex.quote(w) for w in argv)


def worker_entry(trial_dir: str) -> list[str]:
    """The entry point torchrun starts on every rank: autotune's trial worker."""
    return ["-m", WORKER_MODULE, "--trial-dir", trial_dir]


def torchrun_command(
    *,
    nnodes: int,
    nproc_per_node: int,
    entry: Sequence[str] = (),
    program: Sequence[str] = ("torchrun",),
    rdzv_endpoint: str | None = None,
    rdzv_id: str | None = None,
    rdzv_conf: str | None = None,
    node_rank: int | None = None,
    standalone: bool = False,
) -> list[str]:
    """``program`` + torchrun's flags + ``entry``.

    ``standalone``: one node, a local store on a free port (no endpoint). Otherwise the c10d rendezvous at
    ``rdzv_endpoint`` (``HOST:PORT``; None leaves it to the caller, as ``torchrun_args.txt`` does) shared by
    the ``nnodes`` agents that give the same ``rdzv_id``. ``rdzv_conf``: e.g. ``join_timeout=60``.
    """
    if standalone and (nnodes != 1 or rdzv_endpoint is not None):
        raise ValueError("a standalone torchrun is one node without a rendezvous endpoint")
    argv = [
        *program,
        "--nnodes",
        str(nnodes),
        "--nproc_per_node",
        str(nproc_per_node),
        "--rdzv_backend",
        "c10d",
        "--max_restarts",
        "0",
    ]
    if standalone:
        argv.append("--standalone")
    for flag, value in (
        ("--rdzv_endpoint", rdzv_endpoint),
        ("--rdzv_id", rdzv_id),
        ("--rdzv_conf", rdzv_conf),
        ("--node_rank", node_rank),
    ):
        if value is not None:
            argv += [flag, value if isinstance(value, str) else str(value)]
    return [*argv, *entry]
