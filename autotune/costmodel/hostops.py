"""Host time of eager operators where the device does not hide it: ``HostProfile.op_overhead_s`` (0 on GPUs,
measured by ``autotune probe`` on a CPU trial device, ``probe.overhead``) x the ATen operators a micro-batch
dispatches, and ``HostProfile.dtensor_op_overhead_s`` x those that run on DTensors under torch-native TP.

The counts are those of autotune's trial model (``trials.model``), counted with ``TorchDispatchMode`` on
``tiny`` and ``small`` (the count does not depend on the shape; tests/costmodel/test_hostops.py recounts):
a Llama block dispatches 102 operators in forward and 141 in backward (a GPT block with a 2-matrix MLP and
biases 85 and 117), the attention core (rotary + SDPA, what selective recompute replays) 56 in forward, and
the embedding, final norm, head and loss together 17 + 34.

Under autotune's torch TP plan (``trials.parallelize.apply_tp``, torchtitan's) the projections, the sub-layer
entries and, with sequence parallelism, the norms and the residual stream run on DTensors: each such operator
is one dispatch through DTensor (its local operator runs below it). Counted per micro-batch on 2 gloo ranks
(tests/trials/_count_comm.py ``host``; tests/trials/test_tp_comm.py checks these tables against it). The
attention core runs on local tensors (``ColwiseParallel`` hands back local outputs), so selective recompute
replays plain operators only. Each TP collective they issue (``tpcomm.collective_calls``: a redistribution
through functional collectives) costs the host ``HostProfile.dtensor_collective_overhead_s`` beyond the
collective's own time, which ``tpcomm`` prices from the probe's direct calls (``autotune probe``, CPU time
scaled by the ranks' share of a core; the figures: benchmarks/results/calibration_summary.md); one figure for
every kind of collective (the reason is in ``HostProfile.dtensor_collective_overhead_s``).
Megatron and DeepSpeed AutoTP use no DTensors: their TP blocks are charged as unsharded ones.

FSDP2 (``fully_shard`` per block and per end, ``replicate`` per block and the root) runs hooks and copies
around every unit in every micro-batch: ``HostProfile.fsdp_host_unit_s`` per unit and the rank's parameter
bytes at ``fsdp_host_bytes_per_s``, measured on one rank, where no collective moves data, as the wrapped
minus the unwrapped trial model (benchmarks/fsdp_host.py); 0 on GPUs.

DeepSpeed ZeRO-3 runs Python hooks around every module that holds parameters (fetch and release through its
parameter coordinator, in forward and backward) and goes through the rank's parameter bytes (flat fetch
buffers, gradients copied into their partitions), both in every micro-batch: host time per module and
micro-batch (``HostProfile.zero3_host_module_s``) and per parameter byte and micro-batch
(``zero3_host_bytes_per_s``). Measured on one rank, where no collective moves data, as ZeRO-3 minus ZeRO-0
step time on two models at 1, 2 and 4 micro-batches (benchmarks/zero3_host.py); 0 on GPUs.
"""

from __future__ import annotations

from autotune.costmodel.tpcomm import block_collectives
from autotune.plan import Framework, ParallelPlan, Recompute
from autotune.specs import ClusterSpec, ModelSpec

__all__ = [
    "BLOCK_OPS",
    "ATTENTION_CORE_FWD_OPS",
    "EDGE_OPS",
    "TP_BLOCK_OPS",
    "TP_EDGE_OPS",
    "block_ops",
    "tp_block_ops",
    "tp_block_calls",
    "block_host_s",
    "edge_host_s",
    "fsdp_host_s",
    "zero3_host_s",
]

BLOCK_OPS = {True: (102, 141), False: (85, 117)}
"""``gated_mlp`` -> (forward, backward) operators of one block."""
ATTENTION_CORE_FWD_OPS = 56
EDGE_OPS = 17 + 34
"""Embedding, final norm, LM head and cross-entropy, forward + backward."""

TP_BLOCK_OPS = {
    (True, False): (89, 28, 88, 66),
    (True, True): (89, 42, 66, 102),
    (False, False): (75, 24, 55, 74),
    (False, True): (87, 26, 63, 80),
}
"""``(gated_mlp, sequence_parallel)`` -> (forward plain, forward DTensor, backward plain, backward DTensor)
operators of one block under torch TP."""
TP_EDGE_OPS = {
    (True, False): (26, 5, 30, 11),
    (True, True): (26, 12, 18, 29),
    (False, False): (20, 5, 15, 11),
    (False, True): (26, 6, 18, 14),
}
"""The same for the embedding, final norm, head and loss."""


def _torch_tp(plan: ParallelPlan) -> bool:
    return plan.tp > 1 and plan.framework is Framework.FSDP


def block_ops(model: ModelSpec, plan: ParallelPlan) -> int:
    """Plain operators one block dispatches per micro-batch, with its recomputed forward (without TP)."""
    fwd, bwd = BLOCK_OPS[model.gated_mlp]
    recompute = {Recompute.FULL: fwd, Recompute.SELECTIVE: ATTENTION_CORE_FWD_OPS}.get(plan.recompute, 0)
    return fwd + bwd + recompute


def tp_block_ops(model: ModelSpec, plan: ParallelPlan) -> tuple[int, int]:
    """(plain, DTensor) operators of one block per micro-batch under torch TP, with its recomputed forward."""
    fp, fd, bp, bd = TP_BLOCK_OPS[model.gated_mlp, plan.sequence_parallel]
    if plan.recompute is Recompute.FULL:
        return 2 * fp + bp, 2 * fd + bd
    if plan.recompute is Recompute.SELECTIVE:
        return fp + bp + ATTENTION_CORE_FWD_OPS, fd + bd
    return fp + bp, fd + bd


def tp_block_calls(model: ModelSpec, plan: ParallelPlan) -> int:
    """TP collective calls of one block per micro-batch (with SP a reduction is two: gather and scatter)."""
    fwd, bwd = block_collectives(model, plan)
    return (fwd + bwd) * (2 if plan.sequence_parallel else 1)


def _reduction_calls_s(cluster: ClusterSpec, plan: ParallelPlan, reductions: float) -> float:
    """DTensor host time of ``reductions`` TP reductions: all-reduces, or with SP all-gather + reduce-scatter
    pairs (``tpcomm.reduction_s``), two calls each."""
    calls = 2 if plan.sequence_parallel else 1
    return reductions * calls * cluster.gpu.host.dtensor_collective_overhead_s


def block_host_s(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan) -> float:
    gpu = cluster.gpu
    if _torch_tp(plan):
        plain, dtensor = tp_block_ops(model, plan)
        return (
            plain * gpu.host.op_overhead_s
            + dtensor * gpu.host.dtensor_op_overhead_s
            + _reduction_calls_s(cluster, plan, sum(block_collectives(model, plan)))
        )
    return block_ops(model, plan) * gpu.host.op_overhead_s


def edge_host_s(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan) -> float:
    """Outside the blocks (``tpcomm.collective_calls``): the embedding's and the head's reduction (with SP
    each an all-gather + reduce-scatter pair) and the loss's logits all-gather."""
    gpu = cluster.gpu
    if _torch_tp(plan):
        fp, fd, bp, bd = TP_EDGE_OPS[model.gated_mlp, plan.sequence_parallel]
        return (
            (fp + bp) * gpu.host.op_overhead_s
            + (fd + bd) * gpu.host.dtensor_op_overhead_s
            + _reduction_calls_s(cluster, plan, 2)
            + gpu.host.dtensor_collective_overhead_s
        )
    return EDGE_OPS * gpu.host.op_overhead_s


def zero3_host_s(cluster: ClusterSpec, plan: ParallelPlan, modules: int, params: float) -> float:
    """DeepSpeed ZeRO-3's host time of one step over a rank's ``modules`` parameter-holding modules
    (``dpcomm.zero3_gathers``) and ``params`` parameters (held in fp32 by the CPU trial device:
    ``GPUSpec.half_bytes``), both in every micro-batch."""
    if plan.framework is not Framework.DEEPSPEED or plan.zero_stage < 3:
        return 0.0
    gpu = cluster.gpu
    per_byte = 1.0 / gpu.host.zero3_host_bytes_per_s if gpu.host.zero3_host_bytes_per_s else 0.0
    host_s = modules * gpu.host.zero3_host_module_s
    return plan.num_microbatches * (host_s + params * gpu.half_bytes * per_byte)


def fsdp_host_s(cluster: ClusterSpec, plan: ParallelPlan, units: int, params: float) -> float:
    """FSDP2's host time of one step over a rank's ``units`` wrapped units holding ``params`` parameters
    (DP > 1: the trials wrap; parameters held in fp32 by the CPU trial device, ``GPUSpec.half_bytes``)."""
    if plan.framework is not Framework.FSDP or plan.dp <= 1:
        return 0.0
    gpu = cluster.gpu
    per_byte = 1.0 / gpu.host.fsdp_host_bytes_per_s if gpu.host.fsdp_host_bytes_per_s else 0.0
    return plan.num_microbatches * (units * gpu.host.fsdp_host_unit_s + params * gpu.half_bytes * per_byte)
