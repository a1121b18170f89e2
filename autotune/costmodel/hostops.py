"""Host time of eager operators where the device does not hide it: ``GPUSpec.op_overhead_s`` (0 on GPUs,
measured by ``autotune probe`` on a CPU trial device, ``probe.overhead``) x the ATen operators a micro-batch
dispatches.

The counts are those of autotune's trial model (``trials.model``), counted with ``TorchDispatchMode`` on
``tiny`` and ``small`` (the count does not depend on the shape; tests/costmodel/test_hostops.py recounts):
a Llama block dispatches 102 operators in forward and 141 in backward (a GPT block with a 2-matrix MLP and
biases 85 and 117), the attention core (rotary + SDPA, what selective recompute replays) 56 in forward, and
the embedding, final norm, head and loss together 17 + 34.
"""

from __future__ import annotations

from autotune.plan import ParallelPlan, Recompute
from autotune.specs import ClusterSpec, ModelSpec

__all__ = ["BLOCK_OPS", "ATTENTION_CORE_FWD_OPS", "EDGE_OPS", "block_ops", "block_host_s", "edge_host_s"]

BLOCK_OPS = {True: (102, 141), False: (85, 117)}
"""``gated_mlp`` -> (forward, backward) operators of one block."""
ATTENTION_CORE_FWD_OPS = 56
EDGE_OPS = 17 + 34
"""Embedding, final norm, LM head and cross-entropy, forward + backward."""


def block_ops(model: ModelSpec, plan: ParallelPlan) -> int:
    """Operators one block dispatches per micro-batch, with its recomputed forward."""
    fwd, bwd = BLOCK_OPS[model.gated_mlp]
    recompute = {Recompute.FULL: fwd, Recompute.SELECTIVE: ATTENTION_CORE_FWD_OPS}.get(plan.recompute, 0)
    return fwd + bwd + recompute


def block_host_s(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan) -> float:
    return block_ops(model, plan) * cluster.gpu.op_overhead_s


def edge_host_s(cluster: ClusterSpec) -> float:
    return EDGE_OPS * cluster.gpu.op_overhead_s
