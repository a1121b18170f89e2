"""Micro-batches a pipeline rank holds at once: the activations' multiplier under each schedule.

Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
arXiv:2104.04473) Sec. 2.2: GPipe runs every forward before any backward, 1F1B bounds what a rank holds by
the stages after it, the interleaved schedule by Megatron's warm-up
(``megatron/core/pipeline_parallel/schedules.py`` ``get_pp_rank_microbatches``). ``memory.py`` multiplies a
stage's per-micro-batch activations (``activations.py``) by these counts.
"""

from __future__ import annotations

from autotune.plan import ParallelPlan, Schedule

__all__ = ["in_flight_microbatches", "in_flight_of", "microbatches_at_loss"]


def in_flight_microbatches(plan: ParallelPlan, *, rank: int) -> float:
    """Micro-batches of a whole stage whose activations pipeline rank ``rank`` holds at its peak.

    PP = 1: one (gradient accumulation frees each micro-batch in its backward). GPipe: all ``m``.
    1F1B: ``min(pp - rank, m)`` (Narayanan et al. 2021 Sec. 2.2.1: rank 0 holds ``pp``). Interleaved with
    ``v`` chunks: Megatron's warm-up of ``2(pp - rank - 1) + (v - 1) pp`` chunk forwards plus the one in
    progress, in stage units (``/v``); rank 0 gives ``pp (1 + (pp - 1)/(pp v))`` (Korthikanti Sec. 4.2.3).
    Interleaved zero bubble (torch's ScheduleInterleavedZeroBubble): its shorter warm-up and deferred
    weight-gradient halves hold ``pp v`` chunks from forward to weight gradient on every rank, ``min(pp, m)``
    stages, counted as whole activations (the attention core's are freed at the input-gradient half: an
    upper bound); ZBV (``ScheduleZBVZeroBubble``, ``m >= 2 pp - 1``) holds ``2 pp`` chunks, ``pp`` stages,
    on every rank too; tests/test_zero_bubble.py counts all three from torch's own action lists."""
    return in_flight_of(plan.num_microbatches, plan.pp, plan.virtual_stages, plan.schedule, rank)


def in_flight_of(m: int, pp: int, v: int, schedule: Schedule, rank: int) -> float:
    """``in_flight_microbatches`` from the plan fields it reads."""
    if pp == 1:
        return 1.0
    if schedule is Schedule.GPIPE:
        return float(m)
    if schedule is Schedule.INTERLEAVED:
        chunks = 2 * (pp - rank - 1) + (v - 1) * pp + 1
        return min(chunks / v, float(m))
    if schedule.zero_bubble:  # from a chunk's forward to its weight-gradient half: pp v chunks, every rank
        return float(min(pp, m))
    return float(min(pp - rank, m))


def microbatches_at_loss(plan: ParallelPlan) -> float:
    """Micro-batches whose logits the last stage holds: all with GPipe (every forward before any
    backward), else one (the loss's backward follows its forward at once)."""
    return float(plan.num_microbatches) if plan.pp > 1 and plan.schedule is Schedule.GPIPE else 1.0
