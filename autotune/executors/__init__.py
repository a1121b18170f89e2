"""Where a trial's torchrun agents run: one ``Executor.run`` per trial, the same ``TrialResult`` contract.

* ``local``     this machine, one agent (``--standalone``): the default.
* ``multinode`` one agent per node joined by torchrun's c10d rendezvous. On one machine it starts every
                agent on 127.0.0.1 (a multi-node trial without a cluster, for tests); on a cluster, the
                user's own launcher starts it once per node with ``node_ranks``/``rdzv_endpoint``. It
                never reaches other nodes itself (no ssh/pdsh): that is Slurm's or the launcher's job.
* ``slurm``     an ``sbatch`` job per trial, or ``srun`` steps inside the allocation it runs in.

The backend (``autotune.backends.torchrun``) builds the worker's ``TrialConfig`` and hands it over.
"""

from __future__ import annotations

from typing import Any

from autotune.errors import ConfigError
from autotune.executors.base import Executor

__all__ = ["EXECUTORS", "Executor", "get_executor"]

EXECUTORS = ("local", "multinode", "slurm")


def get_executor(name: str, **options: Any) -> Executor:
    """``--executor NAME``; ``options`` are the executor's keyword arguments (``launch=...``, ...)."""
    if name == "local":
        from autotune.executors.local import LocalExecutor

        return LocalExecutor(**options)
    if name == "multinode":
        from autotune.executors.multinode import MultiNodeExecutor

        return MultiNodeExecutor(**options)
    if name == "slurm":
        from autotune.executors.slurm import SlurmExecutor

        return SlurmExecutor(**options)
    raise ConfigError(f"--executor: unknown executor {name!r}; known: {', '.join(EXECUTORS)}")
