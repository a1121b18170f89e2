"""Stage-boundary tensors torch's pipelining keeps per micro-batch (framework ``fsdp``: the trials and
torchtitan both run ``torch.distributed.pipelining.PipelineStage``).

torch/distributed/pipelining/stage.py (torch 2.13; the same design in torch 1963fc8, 2024-12, the
torchtitan 405B runs): ``PipelineStage._setup_forward_recv_info`` allocates, once, one receive buffer of the
stage input per micro-batch ("for chunk_id in range(num_microbatches)") on every non-first stage, and
``_setup_backward_recv_info`` one gradient receive buffer per micro-batch on every non-last stage; both
live for the whole run. ``forward_one_chunk`` keeps each micro-batch's stage output in ``fwd_cache`` until
its backward (the send reads it; no op of the stage saves it). A receive buffer that holds an in-flight
micro-batch's input is that micro-batch's first block input, already counted with the activations; the
others are extra. Megatron instead allocates its receive tensors per transfer and frees each sent output
(megatron/core/pipeline_parallel/schedules.py ``deallocate_output_tensor``): ``pipeline_p2p_bytes``.

Rank ``r`` of ``pp`` runs stages ``r, r + pp, ...`` (``v`` of them): stage 0 (no receive buffers) is on
rank 0, the last stage (no gradient receive buffers; its output is the logits, priced by the loss terms)
on rank ``pp - 1``; ZBV's V placement puts both on rank 0 (``stagesplit.head_rank``).
"""

from __future__ import annotations

from autotune.costmodel.states import MIXED_BF16, Numerics
from autotune.plan import Framework, ParallelPlan
from autotune.specs import ModelSpec
from autotune.stagesplit import head_rank

__all__ = [
    "keeps_stage_buffers",
    "boundary_bytes",
    "stage_buffer_bytes",
    "stage_output_bytes",
    "pipeline_p2p_bytes",
]


def keeps_stage_buffers(plan: ParallelPlan) -> bool:
    """The plan runs torch's ``PipelineStage`` (framework fsdp with PP)."""
    return plan.pp > 1 and plan.framework is Framework.FSDP


def boundary_bytes(model: ModelSpec, plan: ParallelPlan, e: int) -> float:
    """One micro-batch's stage input/output ``s b h`` on one rank (``/t`` with sequence parallelism: the
    hidden states between blocks stay sequence-sharded, torchtitan's and the trials' ``apply_tp``)."""
    side = plan.tp if plan.sequence_parallel else 1
    return plan.seq_len / plan.cp * plan.micro_batch * model.hidden_size * e / side


def _local_stages(plan: ParallelPlan, rank: int) -> tuple[int, int]:
    """Stages of ``rank`` that receive activations, and those that receive gradients (module docstring)."""
    v = plan.virtual_stages
    return v - (rank == 0), v - (rank == head_rank(plan))


def stage_buffer_bytes(model: ModelSpec, plan: ParallelPlan, *, rank: int, in_flight: float, e: int) -> float:
    """Receive buffers held all step: per micro-batch, one input buffer on each receiving stage (less those
    holding an in-flight input, ``in_flight`` per stage as ``inflight.in_flight_microbatches`` gives it)
    and one gradient buffer on each stage that sends."""
    if not keeps_stage_buffers(plan):
        return 0.0
    m = plan.num_microbatches
    receiving, sending = _local_stages(plan, rank)
    spare_inputs = receiving * max(0.0, m - in_flight)
    return (spare_inputs + sending * m) * boundary_bytes(model, plan, e)


def stage_output_bytes(model: ModelSpec, plan: ParallelPlan, *, rank: int, e: int) -> float:
    """Outputs ``fwd_cache`` keeps per in-flight micro-batch of a whole stage (multiply by the in-flight
    count): one boundary tensor on each of the rank's stages that sends (``v`` chunks of ``1/v`` stage each
    hold ``v`` in-flight chunk outputs per stage-sized micro-batch, hence ``sending`` whole)."""
    if not keeps_stage_buffers(plan):
        return 0.0
    _, sending = _local_stages(plan, rank)
    return sending * boundary_bytes(model, plan, e)


def pipeline_p2p_bytes(model: ModelSpec, plan: ParallelPlan, numerics: Numerics = MIXED_BF16) -> float:
    """Megatron's and DeepSpeed's send and receive buffers of the boundary activation ``s b h`` (``/t`` with
    SP) between stages (Narayanan et al. 2021 Sec. 4.1's scatter/gather optimisation sends ``1/t`` of it)."""
    if plan.pp == 1:
        return 0.0
    return 2.0 * boundary_bytes(model, plan, numerics.compute_bytes)
