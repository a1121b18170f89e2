"""``multinode``: one torchrun agent per node, joined by the c10d rendezvous at ``HOST:PORT``.

torchrun's c10d rendezvous needs no hostfile: each agent is started with the same ``--nnodes``,
``--rdzv_endpoint`` and ``--rdzv_id``; the agent on the endpoint's host serves the store, and node ranks
follow the order in which agents join. This executor starts the agents of ``node_ranks`` *here*:

* all of them (the default) on 127.0.0.1 and a free port: an N-node trial on one machine, which exercises
  the same rendezvous, store and failure paths as a cluster (the scale-out tests use it);
* some of them, when the others are started elsewhere with the same ``rdzv_endpoint`` (the tests leave
  one out on purpose). It never logs in to other machines itself: on a cluster, Slurm starts the agents
  (``autotune.executors.slurm``), or the emitted ``launch_torchrun.sh`` under the user's own launcher.

An agent whose peers never arrive gives up after ``join_timeout_s`` (torchrun's ``join_timeout``) and the
trial is a ``rendezvous_error``; the first agent to fail stops the others.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Sequence

from autotune.trials.config import TrialConfig
from autotune.trials.request import ReportFn, TrialRequest
from autotune.trials.result import TrialResult, TrialStatus
from autotune.trials.runner import Launch, launch_command, run_commands

__all__ = ["MultiNodeExecutor", "free_port", "node_layout"]

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A port nothing listens on now (the rendezvous store binds it a moment later)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def node_layout(request: TrialRequest, nnodes: int | None) -> tuple[int, int] | str:
    """``(nnodes, processes per node)`` for the request's plan, or why it does not split evenly.

    ``nnodes`` None: the cluster the plan was made for (``request.cluster.num_nodes``)."""
    nodes = nnodes or request.cluster.num_nodes
    world = request.plan.world_size
    if nodes <= 0 or world % nodes:
        return f"a world size of {world} does not split over {nodes} node(s)"
    return nodes, world // nodes


class MultiNodeExecutor:
    name = "multinode"

    def __init__(
        self,
        *,
        nnodes: int | None = None,
        node_ranks: Sequence[int] | None = None,
        rdzv_endpoint: str | None = None,
        join_timeout_s: float = 60.0,
        launch: Launch | None = None,
    ) -> None:
        """``nnodes``: agents in the trial (default: the cluster's nodes); ``node_ranks``: those started here
        (default: all); ``rdzv_endpoint``: ``HOST:PORT`` of the store (default: 127.0.0.1, a free port);
        ``join_timeout_s``: how long an agent waits for the others (capped at the trial's timeout)."""
        self.nnodes, self.rdzv_endpoint, self.join_timeout_s = nnodes, rdzv_endpoint, join_timeout_s
        self.node_ranks = None if node_ranks is None else tuple(node_ranks)
        self.launch = launch or Launch()

    def run(
        self, request: TrialRequest, *, config: TrialConfig, report: ReportFn | None = None
    ) -> TrialResult:
        layout = node_layout(request, self.nnodes)
        if isinstance(layout, str):
            return TrialResult(status=TrialStatus.ERROR, error=layout, wall_s=0.0)
        nnodes, nproc = layout
        trial_dir = request.trial_dir.resolve()
        join_s = max(1, int(min(self.join_timeout_s, request.timeout_s)))
        base = dataclasses.replace(
            self.launch,
            nnodes=nnodes,
            nproc_per_node=nproc,
            rdzv_endpoint=self.rdzv_endpoint or f"{LOOPBACK}:{free_port()}",
            rdzv_id=f"autotune-{trial_dir.name}",
            rdzv_conf=self.launch.rdzv_conf or f"join_timeout={join_s}",
        )
        ranks = range(nnodes) if self.node_ranks is None else self.node_ranks
        commands = [
            launch_command(trial_dir, nproc=nproc, launch=dataclasses.replace(base, node_rank=r))
            for r in ranks
        ]
        return run_commands(
            request, commands, config=config, launch=base, nproc=nproc * len(commands), report=report
        )
