"""Helpers of the multi-node and Slurm trial tests: the tiny model's requests on an N-node CPU "cluster",
and the no-process-left check."""

from __future__ import annotations

from pathlib import Path

from autotune.catalog import load_model, make_cluster
from autotune.plan import ParallelPlan
from autotune.trials.request import TrialRequest
from autotune.trials.runner import live_trial_pids

PLAN = ParallelPlan(dp=2, global_batch=4, seq_len=32)
"""Two ranks: one per node on two nodes, or both on one."""


def make_request(
    plan: ParallelPlan, trial_dir: Path, *, num_nodes: int = 1, timeout_s: float = 120.0
) -> TrialRequest:
    cluster = make_cluster(num_gpus=plan.world_size, gpu="cpu", gpus_per_node=plan.world_size // num_nodes)
    return TrialRequest(
        model=load_model("tiny"),
        cluster=cluster,
        plan=plan,
        trial_dir=trial_dir,
        timeout_s=timeout_s,
        warmup_steps=1,
        measure_steps=2,
    )


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def assert_nothing_left(trial_dir: Path) -> None:
    """No process names the trial directory, and every worker that wrote a ``started`` marker is gone."""
    assert live_trial_pids(trial_dir.resolve()) == []
    assert not [pid for p in trial_dir.glob("started.*") if _alive(pid := int(p.read_text()))]
