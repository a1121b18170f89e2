"""ParallelPlan -> ``torchrun`` arguments for autotune's own trainer (``python -m autotune.trials.worker``).

The worker's only argument is ``--trial-dir DIR``: it reads the plan and the model from ``DIR/plan.json``
and ``DIR/trial.json`` (``emit_all`` writes both under ``trial/``) and writes its markers and
``result.json`` there. The torchrun part carries the node layout and the c10d rendezvous; the endpoint
(``HOST:PORT``) is per launch and added by ``launch_torchrun.sh`` / ``launch_slurm.sbatch``. All of them
are built by ``autotune.emit.command.torchrun_command``, the function trials are launched with too.
"""

from __future__ import annotations

import hashlib
import json
import shlex

from autotune.emit.command import WORKER_MODULE, torchrun_command, worker_entry
from autotune.plan import LossKernel, ParallelPlan
from autotune.specs import ClusterSpec

__all__ = [
    "WORKER_MODULE",
    "TRIAL_DIR",
    "rdzv_id",
    "torchrun_args",
    "trainer_unsupported",
    "worker_args",
    "torchrun_args_text",
]

TRIAL_DIR = "trial"
"""The worker's directory inside the emitted folder."""


def trainer_unsupported(plan: ParallelPlan) -> list[str]:
    """Why autotune's trainer cannot run ``plan`` as priced; [] when it can (the rest it refuses at start)."""
    if plan.loss_kernel in (LossKernel.FUSED, LossKernel.CHUNKED):
        return ["autotune's trainer runs torch's cross-entropy (fp32 or bf16 logits), not a fused kernel"]
    return []


def rdzv_id(plan: ParallelPlan, cluster: ClusterSpec) -> str:
    """A stable rendezvous id: agents of one job must agree on it, other jobs should not collide."""
    text = json.dumps([plan.to_dict(), cluster.name], sort_keys=True)
    return f"autotune-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def torchrun_args(plan: ParallelPlan, cluster: ClusterSpec) -> list[str]:
    """Launcher flags (everything but ``--rdzv_endpoint`` and the entry point)."""
    assert plan.world_size == cluster.num_gpus, "check_plan() runs before any emitter"
    return torchrun_command(program=(), nnodes=cluster.num_nodes, nproc_per_node=cluster.gpus_per_node)


def worker_args(trial_dir: str = TRIAL_DIR) -> list[str]:
    """The entry point torchrun starts on every rank."""
    return worker_entry(trial_dir)


def torchrun_args_text(plan: ParallelPlan, cluster: ClusterSpec) -> str:
    """``torchrun_args.txt``: one shell-quoted line, run from the emitted folder; add
    ``--rdzv_endpoint HOST:PORT`` (``launch_torchrun.sh`` does)."""
    return shlex.join([*torchrun_args(plan, cluster), *worker_args()]) + "\n"
