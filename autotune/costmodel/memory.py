"""Per-GPU memory of one training step, on the WORST rank.

Convention: the first and the last pipeline stage are evaluated and the larger total is reported (the first
holds the embedding and, with 1F1B/interleaving, the most in-flight micro-batches; the last holds the output
layer and the loss); with an uneven split (``autotune/stagesplit.py``) also the most loaded middle
stage. Inside a stage every TP/CP/DP rank is alike. A stage's peak is the larger of two
moments, and the breakdown shows the components of that moment:

- the loss (last stage only): stored activations + logits + the loss's fp32 gradient buffers + what is
  gathered then;
- FSDP2's end units' backwards (``dpbuffers.end_backward_bytes``): the head's, with every activation still
  stored, and the embeddings', the step's last;
- one layer's backward: stored activations + that layer's gradient/recompute working set + the gathered
  current and prefetched units and one unsharded gradient (ZeRO-3/FSDP);
- the optimizer step: no activations, but the step's temporaries (shown in ``optimizer_bytes``).

Pipelining + FSDP2 (``states.defers_grad_reduce``; ``deferredreduce.py`` cites torch) adds the stage's
unsharded gradients, accumulated from the first backward to the end-of-step reduction, and parameters left
gathered after each backward, with two more moments: the end of a backward (the whole stage gathered, one
micro-batch's activations freed) and the reduction itself.

torch's pipelining (framework fsdp) keeps a receive buffer per micro-batch and the outputs of in-flight
micro-batches (``pipebuffers.py``); Megatron two transfer buffers (``pipeline_p2p_bytes``).

Model states (``states.py``) and activations (``activations.py``) cite their sources; the CUDA/NCCL context
and the allocator slack (``reserve.py``) are measured constants. The total is the reserved peak as the device
shows it; a plan is out of memory when the allocated peak (``MemoryBreakdown.needed_bytes``, the total less
the slack the allocator gives back before it fails) exceeds the device. Numbers assume bf16 mixed precision
with fp32 master weights (``MIXED_BF16``; fp8 plans keep bf16 weights, and fp8 GEMM inputs where the
framework saves them: ``activations.kernels_for``); ``numerics=FP32``
describes plain fp32 training, which is what the CPU cross-check (benchmarks/memory_crosscheck.py)
measures.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import NamedTuple

from autotune.costmodel import actoffload
from autotune.costmodel.activations import (
    Kernels,
    LayerShape,
    backward_working_bytes,
    head_activation_bytes,
    host_activation_bytes,
    kernels_for,
    stage_activation_bytes,
)
from autotune.costmodel.cpbuffers import cp_attention_bytes
from autotune.costmodel.deferredreduce import KeptBytes, deferred_reduce_bytes
from autotune.costmodel.dpbuffers import comm_bucket_bytes, end_backward_bytes, gathered_bytes
from autotune.costmodel.inflight import in_flight_microbatches, microbatches_at_loss
from autotune.costmodel.lossmemory import loss_stored_bytes, loss_transient_bytes
from autotune.costmodel.pipebuffers import (
    keeps_stage_buffers,
    pipeline_p2p_bytes,
    stage_buffer_bytes,
    stage_output_bytes,
)
from autotune.costmodel.recompute_modules import freed_bytes_per_layer
from autotune.costmodel.reserve import fragmentation_bytes, reserve_bytes
from autotune.costmodel.stagestates import ranks_to_check, stage_states, states_floor_bytes
from autotune.costmodel.states import MIXED_BF16, Numerics
from autotune.pickled import by_values
from autotune.plan import ParallelPlan, Schedule
from autotune.specs import ClusterSpec, ModelSpec
from autotune.stagesplit import head_rank

__all__ = [
    "MemoryBreakdown",
    "memory_breakdown",
    "states_floor_bytes",
    "stage_memory",
    "pipeline_p2p_bytes",
]


@by_values
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
    """ZeRO-3/FSDP all-gathered (unsharded) parameter and gradient buffers in flight; with pipelining +
    FSDP2 also those a stage keeps until its end-of-step reduction (``KeptBytes``)."""
    comm_buffer_bytes: float
    """DDP/ZeRO gradient buckets and other communication staging."""
    reserve_bytes: float
    """CUDA context and NCCL: measured constants (a small constant on CPU trials)."""
    host_bytes_per_node: float = 0.0
    """Host memory the offloaded optimizer needs on one node."""
    fragmentation_bytes: float = 0.0
    """Caching-allocator slack: reserved but not allocated at the peak (``FRAGMENTATION_FRACTION``)."""

    @property
    def total_bytes(self) -> float:
        """The caching allocator's reserved peak plus the CUDA/NCCL context: what the device shows."""
        return (
            self.weights_bytes
            + self.gradients_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.logits_bytes
            + self.prefetch_bytes
            + self.comm_buffer_bytes
            + self.reserve_bytes
            + self.fragmentation_bytes
        )

    @property
    def needed_bytes(self) -> float:
        """What the step cannot run without: ``total_bytes`` less the allocator's cached slack. Before it
        raises out-of-memory the caching allocator frees its cached blocks and retries
        (c10/cuda/CUDACachingAllocator.cpp ``DeviceCachingAllocator::malloc``: ``alloc_block``, then
        ``release_available_cached_blocks``, then ``release_cached_blocks``), so a step whose reserved
        peak would pass the device still runs while its allocated bytes fit."""
        return self.total_bytes - self.fragmentation_bytes

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


class _Moment(NamedTuple):
    activations: float
    logits: float
    prefetch: float
    step_temp: float


def _moments(
    model: ModelSpec,
    plan: ParallelPlan,
    *,
    rank: int,
    layers: float,
    numerics: Numerics,
    k: Kernels,
    step_bytes: float,
    kept: KeptBytes,
) -> list[_Moment]:
    """The candidate peaks of one stage (module docstring); bytes beyond the model states."""
    first, last = rank == 0, rank == head_rank(plan)  # a V puts both ends on rank 0
    e, t, sp, rc = numerics.compute_bytes, plan.tp, plan.sequence_parallel, plan.recompute
    x = LayerShape.of(model, plan)
    per_stage = stage_activation_bytes(x, plan, layers=layers, e=e, k=k)
    per_stage -= layers * freed_bytes_per_layer(model, plan, e=e, k=k)  # --recompute-modules
    offloaded = actoffload.offloaded_bytes_per_layer(model, plan, e=e, k=k)  # --offload-modules
    per_stage -= layers * offloaded
    head_first = head_activation_bytes(x, tp=t, sp=sp, e=e, k=k, first=first, last=False)
    logit_sets = 1 + model.mtp_layers  # each multi-token prediction module runs the head and a loss
    head_last = logit_sets * head_activation_bytes(x, tp=t, sp=sp, e=e, k=k, first=False, last=last)
    at_loss = microbatches_at_loss(plan) if last else 0.0
    in_flight = in_flight_microbatches(plan, rank=rank)
    outputs = stage_output_bytes(model, plan, rank=rank, e=e)  # torch pipelining's fwd_cache
    stored = in_flight * (per_stage + head_first + outputs) + at_loss * head_last
    stored += min(float(actoffload.RESIDENT_LAYERS), layers) * offloaded  # in use and reloading (actoffload)
    working = backward_working_bytes(
        x, tp=t, sp=sp, recompute=rc, e=e, k=k, attention=cp_attention_bytes(model, plan, e)
    )
    one_logits = logit_sets * loss_stored_bytes(x, tp=t, e=e, k=k) if last else 0.0
    logits = (at_loss - 1) * one_logits if last else 0.0  # this micro-batch's loss is freed by now
    accumulated = kept.grads_bytes if plan.num_microbatches > in_flight else 0.0  # a backward ran earlier
    backward = _Moment(
        activations=stored + working,
        logits=logits,
        step_temp=0.0,
        prefetch=gathered_bytes(model, plan, numerics, first=first, last=last, backward=True) + accumulated,
    )
    moments = [backward, _Moment(activations=0.0, logits=0.0, prefetch=0.0, step_temp=step_bytes)]
    embed_bw, head_bw = end_backward_bytes(model, plan, numerics, first=first, last=last)
    if head_bw:  # the head's backward: the loss's buffers freed, every activation still stored
        moments.append(
            _Moment(activations=stored, logits=logits, prefetch=head_bw + accumulated, step_temp=0.0)
        )
    if embed_bw:  # the embeddings' backward, the step's last: every block's activations freed
        moments.append(_Moment(activations=0.0, logits=0.0, prefetch=embed_bw + accumulated, step_temp=0.0))
    if kept != KeptBytes():
        freed = (per_stage + head_first + outputs) / plan.virtual_stages + (head_last if last else 0.0)
        moments += _deferred_reduce_moments(
            kept, after_backward=max(0.0, stored - freed) + working, logits=logits
        )
    if not last:
        return moments
    loss_grads = kept.grads_bytes if _backward_before_loss(plan) else 0.0
    loss = _Moment(
        activations=stored,
        logits=at_loss * one_logits + loss_transient_bytes(x, tp=t, e=e, k=k),
        prefetch=gathered_bytes(model, plan, numerics, first=first, last=last, backward=False) + loss_grads,
        step_temp=0.0,
    )
    return [loss, *moments]


def _deferred_reduce_moments(kept: KeptBytes, *, after_backward: float, logits: float) -> list[_Moment]:
    """Pipelining + FSDP2 (``deferred_reduce_bytes``): the end of a backward, with every unit of the stage
    gathered, all gradients accumulated, one micro-batch's activations freed (on its own chunk with
    interleaving: ``1/v`` of the stage) and the first layer's backward working set; and the end-of-step
    reduction (no activations; one unit's reduce-scatter input)."""
    held = kept.params_bytes + kept.grads_bytes
    return [
        _Moment(
            activations=after_backward, logits=logits, prefetch=held + kept.unit_grad_bytes, step_temp=0.0
        ),
        _Moment(activations=0.0, logits=0.0, prefetch=held + kept.reduce_input_bytes, step_temp=0.0),
    ]


def _backward_before_loss(plan: ParallelPlan) -> bool:
    """The last stage runs a backward before some later loss (1F1B, interleaved: torch's schedules
    alternate after the warm-up); GPipe runs every forward, and so every loss, first."""
    return plan.schedule is not Schedule.GPIPE and plan.num_microbatches > 1


def stage_memory(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: ParallelPlan,
    *,
    rank: int,
    numerics: Numerics = MIXED_BF16,
    kernels: Kernels | None = None,
) -> MemoryBreakdown:
    """Peak memory of pipeline rank ``rank``: model states plus the largest of its loss, backward and
    optimizer-step moments (module docstring); its blocks as ``autotune/stagesplit.py`` splits them."""
    k = kernels if kernels is not None else kernels_for(plan)
    first, last = rank == 0, rank == head_rank(plan)  # a V puts both ends on rank 0
    layers, params, states = stage_states(model, plan, numerics, rank=rank)
    kept = deferred_reduce_bytes(
        model,
        plan,
        numerics,
        first=first,
        last=last,
        sharded_grad_bytes=states.gradients_bytes,
        layers=layers,
    )
    moments = _moments(
        model, plan, rank=rank, layers=layers, numerics=numerics, k=k, step_bytes=states.step_bytes, kept=kept
    )
    peak = max(moments, key=sum)
    comm = comm_bucket_bytes(plan, params, numerics)
    if keeps_stage_buffers(plan):  # allocated once, kept: no allocator slack
        in_flight, e = in_flight_microbatches(plan, rank=rank), numerics.compute_bytes
        kept_buffers = stage_buffer_bytes(model, plan, rank=rank, in_flight=in_flight, e=e)
    else:
        comm, kept_buffers = comm + pipeline_p2p_bytes(model, plan, numerics), 0.0
    transient = peak.activations + peak.logits + peak.prefetch + peak.step_temp + comm
    return MemoryBreakdown(
        weights_bytes=states.weights_bytes,
        gradients_bytes=states.gradients_bytes,
        optimizer_bytes=states.optimizer_bytes + peak.step_temp,
        activations_bytes=peak.activations,
        logits_bytes=peak.logits,
        prefetch_bytes=peak.prefetch,
        comm_buffer_bytes=comm + kept_buffers,
        reserve_bytes=reserve_bytes(cluster, plan),
        host_bytes_per_node=(
            states.host_bytes
            + host_activation_bytes(
                LayerShape.of(model, plan), plan, layers=layers, e=numerics.compute_bytes, k=k
            )
            + in_flight_microbatches(plan, rank=rank)
            * layers
            * actoffload.offloaded_bytes_per_layer(model, plan, e=numerics.compute_bytes, k=k)
        )
        * cluster.gpus_per_node,
        fragmentation_bytes=fragmentation_bytes(cluster, transient),
    )


def memory_breakdown(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: ParallelPlan,
    *,
    numerics: Numerics = MIXED_BF16,
    kernels: Kernels | None = None,
) -> MemoryBreakdown:
    """Memory of the worst GPU: the largest of the first, the last and (uneven splits) the most loaded
    middle pipeline stage (module docstring). ``host_bytes_per_node`` is the larger stage's offloaded
    bytes per GPU x GPUs per node."""
    k = kernels if kernels is not None else kernels_for(plan)  # one plan: the same kernels on every stage
    stages = [
        stage_memory(model, cluster, plan, rank=r, numerics=numerics, kernels=k)
        for r in ranks_to_check(model, plan)
    ]
    worst = max(stages, key=lambda m: m.total_bytes)
    host = max(m.host_bytes_per_node for m in stages)
    return replace(worst, host_bytes_per_node=host)
