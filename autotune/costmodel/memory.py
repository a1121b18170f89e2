"""Per-GPU memory of one training step, on the WORST rank.

Convention: the first and the last pipeline stage are evaluated and the larger total is reported (the first
holds the embedding and, with 1F1B/interleaving, the most in-flight micro-batches; the last holds the output
layer and the loss). Inside a stage every TP/CP/DP rank is alike. A stage's peak is the larger of two
moments, and the breakdown shows the components of that moment:

- the loss (last stage only): stored activations + logits + the loss's fp32 gradient buffers + what is
  gathered then (FSDP2's root unit);
- one layer's backward: stored activations + that layer's gradient/recompute working set + the gathered
  current and prefetched units and one unsharded gradient (ZeRO-3/FSDP);
- the optimizer step: no activations, but the step's temporaries (shown in ``optimizer_bytes``).

Model states (``states.py``) and activations (``activations.py``) cite their sources; the runtime reserve
below is a set of documented constants. Numbers assume bf16 mixed precision with fp32 master weights
(``MIXED_BF16``; fp8 plans keep bf16 weights and activations here, an upper bound); ``numerics=FP32``
describes plain fp32 training, which is what the CPU cross-check (benchmarks/memory_crosscheck.py)
measures.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple

from autotune.costmodel.activations import (
    Kernels,
    LayerShape,
    backward_working_bytes,
    head_activation_bytes,
    in_flight_microbatches,
    kernels_for,
    layer_activation_bytes,
    loss_stored_bytes,
    loss_transient_bytes,
    microbatches_at_loss,
)
from autotune.costmodel.states import (
    MIXED_BF16,
    Numerics,
    comm_bucket_bytes,
    gathered_bytes,
    model_state_bytes,
    stage_params_per_gpu,
)
from autotune.plan import ParallelPlan, Sharding
from autotune.specs import ClusterSpec, ModelSpec

__all__ = [
    "MemoryBreakdown", "memory_breakdown", "stage_memory", "reserve_bytes", "pipeline_p2p_bytes",
    "CUDA_CONTEXT_BYTES", "NCCL_CONTEXT_BYTES", "NCCL_BYTES_PER_COMMUNICATOR", "FRAGMENTATION_FRACTION",
    "CPU_RESERVE_BYTES",
]

_MIB = 1024**2

CUDA_CONTEXT_BYTES = 685 * _MIB
"""CUDA context of a PyTorch process: device memory in use outside the caching allocator after the first
bf16 GEMM. Measured 718,077,952 B on an H200 with torch 2.11 + CUDA 13.0
(benchmarks/results/memory_crosscheck_gpu.json, ``context_bytes``)."""
NCCL_CONTEXT_BYTES = 558 * _MIB
"""NCCL's first communicator (its device code, proxy and buffers): measured 585,105,408 B for a 1-rank
communicator after one all-reduce on the same H200 (``nccl_world1_bytes``). Counted once when any
parallel axis is > 1."""
NCCL_BYTES_PER_COMMUNICATOR = 256 * _MIB
"""Peer buffers of each communicator (one per parallel axis of degree > 1): NCCL_BUFFSIZE 4 MiB x up to
32 channels x send/recv (NCCL environment-variable docs, NCCL_BUFFSIZE / NCCL_MAX_NCHANNELS). Not measured
here (one GPU); an estimate."""
FRAGMENTATION_FRACTION = 0.15
"""Caching-allocator slack (reserved - allocated at the peak) as a share of the bytes that come and go in
a step (activations, logits, gather buffers, step temporaries): 13-15% when activations dominate,
up to ~50% when the optimizer step's one large buffer does (benchmarks/results/memory_crosscheck_gpu.json,
H200). ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` removes most of it (PyTorch CUDA semantics
notes, "Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF")."""
CPU_RESERVE_BYTES = 64 * _MIB
"""CPU trials: gloo buffers and allocator slack; no device context exists (glibc malloc returns large
blocks to the system, so there is no caching-allocator fragmentation to speak of)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryBreakdown:
    """Bytes on the most-loaded GPU, by what they hold."""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    """fp32 master weights + Adam moments kept on the GPU (0 when offloaded)."""
    activations_bytes: float
    """Activations of all in-flight micro-batches on the worst stage."""
    logits_bytes: float
    """fp32 logits / loss buffers on the stage that holds the output layer."""
    prefetch_bytes: float
    """ZeRO-3/FSDP all-gathered (unsharded) parameter and gradient buffers in flight."""
    comm_buffer_bytes: float
    """DDP/ZeRO gradient buckets and other communication staging."""
    reserve_bytes: float
    """CUDA context, NCCL, allocator fragmentation: documented constants."""
    host_bytes_per_node: float = 0.0
    """Host memory the offloaded optimizer needs on one node."""

    @property
    def total_bytes(self) -> float:
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.activations_bytes
                + self.logits_bytes + self.prefetch_bytes + self.comm_buffer_bytes + self.reserve_bytes)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def pipeline_p2p_bytes(model: ModelSpec, plan: ParallelPlan, numerics: Numerics = MIXED_BF16) -> float:
    """Send and receive buffers of the boundary activation ``s b h`` (``/t`` with SP) between stages
    (Narayanan et al. 2021 Sec. 4.1's scatter/gather optimisation sends ``1/t`` of it)."""
    if plan.pp == 1:
        return 0.0
    side = plan.tp if plan.sequence_parallel else 1
    return 2.0 * plan.seq_len / plan.cp * plan.micro_batch * model.hidden_size * numerics.compute_bytes / side


def reserve_bytes(cluster: ClusterSpec, plan: ParallelPlan, transient_bytes: float) -> float:
    """CUDA context + NCCL (its first communicator, then one per parallel axis of degree > 1; HSDP has
    two) + allocator fragmentation on the bytes that come and go; a small constant on CPU trials."""
    if cluster.gpu.key == "cpu":
        return float(CPU_RESERVE_BYTES)
    axes = sum(d > 1 for d in (plan.tp, plan.pp, plan.dp, plan.cp)) + (plan.sharding is Sharding.HSDP)
    nccl = (NCCL_CONTEXT_BYTES + axes * NCCL_BYTES_PER_COMMUNICATOR) if axes else 0.0
    return CUDA_CONTEXT_BYTES + nccl + FRAGMENTATION_FRACTION * transient_bytes


class _Moment(NamedTuple):
    activations: float
    logits: float
    prefetch: float
    step_temp: float


def _moments(model: ModelSpec, plan: ParallelPlan, *, rank: int, numerics: Numerics, k: Kernels,
             step_bytes: float) -> list[_Moment]:
    """The candidate peaks of one stage (module docstring); bytes beyond the model states."""
    first, last = rank == 0, rank == plan.pp - 1
    e, t, sp, rc = numerics.compute_bytes, plan.tp, plan.sequence_parallel, plan.recompute
    x = LayerShape.of(model, plan)
    per_stage = model.num_layers / plan.pp * layer_activation_bytes(x, tp=t, sp=sp, recompute=rc, e=e, k=k)
    head_first = head_activation_bytes(x, tp=t, sp=sp, e=e, k=k, first=first, last=False)
    at_loss = microbatches_at_loss(plan) if last else 0.0
    stored = (in_flight_microbatches(plan, rank=rank) * (per_stage + head_first)
              + at_loss * head_activation_bytes(x, tp=t, sp=sp, e=e, k=k, first=False, last=last))
    one_logits = loss_stored_bytes(x, tp=t) if last else 0.0
    backward = _Moment(
        activations=stored + backward_working_bytes(x, tp=t, sp=sp, recompute=rc, e=e, k=k),
        logits=(at_loss - 1) * one_logits if last else 0.0,  # this micro-batch's loss is freed by now
        prefetch=gathered_bytes(model, plan, numerics, first=first, last=last, backward=True), step_temp=0.0)
    step = _Moment(activations=0.0, logits=0.0, prefetch=0.0, step_temp=step_bytes)
    if not last:
        return [backward, step]
    loss = _Moment(activations=stored, logits=at_loss * one_logits + loss_transient_bytes(x, tp=t, e=e, k=k),
                   prefetch=gathered_bytes(model, plan, numerics, first=first, last=last, backward=False),
                   step_temp=0.0)
    return [loss, backward, step]


def stage_memory(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, *, rank: int,
                 numerics: Numerics = MIXED_BF16, kernels: Kernels | None = None) -> MemoryBreakdown:
    """Peak memory of pipeline rank ``rank`` (0 or ``pp - 1``): model states plus the largest of its
    loss, backward and optimizer-step moments (module docstring)."""
    k = kernels if kernels is not None else kernels_for(plan)
    params = stage_params_per_gpu(model, plan, first=rank == 0, last=rank == plan.pp - 1)
    states = model_state_bytes(params, plan, numerics)
    moments = _moments(model, plan, rank=rank, numerics=numerics, k=k, step_bytes=states.step_bytes)
    peak = max(moments, key=sum)
    comm = comm_bucket_bytes(plan, params, numerics) + pipeline_p2p_bytes(model, plan, numerics)
    transient = peak.activations + peak.logits + peak.prefetch + peak.step_temp + comm
    return MemoryBreakdown(
        weights_bytes=states.weights_bytes, gradients_bytes=states.gradients_bytes,
        optimizer_bytes=states.optimizer_bytes + peak.step_temp, activations_bytes=peak.activations,
        logits_bytes=peak.logits, prefetch_bytes=peak.prefetch, comm_buffer_bytes=comm,
        reserve_bytes=reserve_bytes(cluster, plan, transient),
        host_bytes_per_node=states.host_bytes * cluster.gpus_per_node)


def memory_breakdown(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, *,
                     numerics: Numerics = MIXED_BF16, kernels: Kernels | None = None) -> MemoryBreakdown:
    """Memory of the worst GPU: the larger of the first and the last pipeline stage (module docstring).
    ``host_bytes_per_node`` is the larger stage's offloaded bytes per GPU x GPUs per node."""
    stages = [stage_memory(model, cluster, plan, rank=r, numerics=numerics, kernels=kernels)
              for r in sorted({0, plan.pp - 1})]
    worst = max(stages, key=lambda m: m.total_bytes)
    host = max(m.host_bytes_per_node for m in stages)
    return MemoryBreakdown(**{**worst.as_dict(), "host_bytes_per_node": host})
