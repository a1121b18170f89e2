"""Where CPU trial ranks run: how many intra-op threads each gets and whether it is pinned (torch-free).

torch gives every process all the cores by default, so ranks of one trial would oversubscribe the CPU and
time each other's context switches. The policy (``cpu_share``) splits the node's cores over its ranks:

* more cores than ranks: one core is left to torchrun's agent, autotune's runner and gloo's threads, and
  each rank is pinned to its own ``(cores - 1) // ranks`` cores. Their wake-ups then never preempt a
  rank's OpenMP team (a team of ``t`` threads waits at every barrier for its slowest member). Measured on
  the 2-core CI VM, ``tiny`` at world size 1, 5 trials of 30 steps (benchmarks/trial_overhead.py):
  repeat CoV 10.6 % with 2 unpinned threads, 6.9 % with 1 unpinned thread, 1.5 % with 1 pinned thread.
* as many ranks as cores or more: one thread each, unpinned. Pinning then also pins a rank's gloo threads
  to its core, which measured worse (dp2 on 2 cores: repeat CoV 7.9 % pinned, 3.9 % unpinned).

Only on one node: agents of a multi-node job that share a host (loopback tests) cannot see each other's
ranks, so they do not pin. ``OMP_NUM_THREADS`` and ``AUTOTUNE_CPU_AFFINITY`` (``1``/``0``) override.
"""

from __future__ import annotations

__all__ = ["CPU_AFFINITY_ENV", "cpu_share"]

CPU_AFFINITY_ENV = "AUTOTUNE_CPU_AFFINITY"
"""``1``: pin each CPU trial rank to its own cores; ``0``: never; unset: ``cpu_share`` decides."""


def cpu_share(cores: int, ranks: int, *, single_node: bool = True) -> tuple[int, bool]:
    """``(threads per rank, pin)`` for ``ranks`` trial processes on a node with ``cores`` usable cores."""
    ranks = max(1, ranks)
    if single_node and cores > ranks:
        return max(1, (cores - 1) // ranks), True
    return max(1, cores // ranks), False
