"""Pipeline-parallel terms: the fill/drain bubble, the load of the busiest stage and the activation sends.

Convention: times are those of the most-loaded pipeline rank, which sets the pace of every stage.
"""

from __future__ import annotations

import math

from autotune.costmodel import comm
from autotune.costmodel.tpcomm import act_bytes
from autotune.plan import Framework, ParallelPlan
from autotune.specs import ClusterSpec, ModelSpec
from autotune.stagesplit import split_layers

__all__ = [
    "bubble_fraction",
    "zbv_bubble_fraction",
    "shared_core_bubble_fraction",
    "stage_split",
    "rank_blocks",
    "sends_s",
]


def bubble_fraction(
    pp: int, num_microbatches: int, virtual_stages: int = 1, weight_grad_share: float | None = None
) -> float:
    """Idle time of a pipeline flush relative to the ideal compute time of one step.

    GPipe and 1F1B (PipeDream-Flush) both idle ``(p-1)`` micro-batch slots while filling and draining:
    ``(p-1)/m`` (Narayanan et al. 2021 Sec. 2.2.1, Eq. 1). The interleaved schedule gives each rank ``v``
    model chunks, so a slot is ``1/v`` as long: ``(p-1)/(m v)`` (Sec. 2.2.2). 1F1B differs from GPipe in
    memory (at most ``p`` micro-batches in flight), not in bubble.

    Zero bubble (``weight_grad_share`` given: ``W / (F + B + W)`` of a slot, ``W`` the weight-gradient half
    of the backward, ``B`` the input-gradient half): the deferred ``W`` fill the drain, leaving
    ``(p-1)(F + B - W)`` per chunk (Qi et al. 2024, arXiv:2401.10241, Sec. 3, ZB-H1), i.e. ``(p-1)/(m v)``
    x ``(1 - 2 share)``; tests/test_zero_bubble.py replays torch's own action lists to the same figure.
    """
    if pp <= 1:
        return 0.0
    slots = (pp - 1) / (num_microbatches * max(1, virtual_stages))
    if weight_grad_share is None:
        return slots
    return slots * max(0.0, 1.0 - 2.0 * weight_grad_share)


def zbv_bubble_fraction(
    pp: int, num_microbatches: int, forward_share: float, weight_grad_share: float
) -> float:
    """Idle time of torch's ZBV schedule (``ScheduleZBVZeroBubble``, Qi et al. 2024 Sec. 6) relative to the
    ideal compute of one step, its ``m >= 2p - 1`` micro-batches in two chunks per rank.

    With ``F``, ``I``, ``W`` the shares of a chunk's forward, input-gradient and weight-gradient work, the
    bubble is ``max`` of eight linear forms in ``(F, I, W)`` chunk slots, ``/(2m)``: the critical paths of
    torch's fixed action order, found by replaying its per-rank lists symbolically for PP 2-16 and checked
    against a numeric replay (tests/test_zero_bubble.py). ``(p-1) I`` usually binds; ``2(p-1)(I-W)`` when the
    weight half is small. With ``F = I = W`` it is ``(p-1) F`` (the last rank's first forward waits for the
    others'; no order avoids it), a third of interleaved 1F1B's over two chunks.
    """
    if pp <= 1:
        return 0.0
    f, w = forward_share, weight_grad_share
    i, q = 1.0 - f - w, pp - 1
    forms = (
        (0, q, 0),
        (1, 0, pp - 2),
        (0, 1, pp - 2),
        (2 * pp - 3, -(pp - 2), 0),
        (0, 2 * q, -2 * q),
        (2 * q, 0, -(2 * pp - 1)),
        (2 * pp - 3, 1, -2 * q),
        (2 * q, -q, -1),
    )
    return max(0.0, max(a * f + b * i + c * w for a, b, c in forms)) / (2 * num_microbatches)


def shared_core_bubble_fraction(bubble: float, ranks_per_node: int, cores_per_node: int | None) -> float:
    """The bubble a step pays when the node's ranks share fewer cores than there are ranks (CPU trials).

    A rank idle in the fill or drain frees its share of the cores for the ranks that still compute. With
    ``R`` ranks on ``K < R`` cores, each computing rank runs at ``K/R`` of a core (what ``autotune probe``
    measures with every rank busy), so a step cannot end before the node has done all ranks' work:
    ``m`` micro-batch slots at that rate (the throughput bound, no bubble); nor before the pipeline's
    critical path at the fastest a rank can go alone, one core: ``(1 + bubble) m`` slots at ``K/R`` of
    the contended time. The step takes the larger: a bubble of ``max(0, (K/R)(1 + bubble) - 1)`` slots
    per micro-batch slot. ``cores_per_node`` None (a device per rank) or ``>= R``: the bubble itself."""
    if cores_per_node is None or cores_per_node >= ranks_per_node or bubble <= 0:
        return bubble
    return max(0.0, cores_per_node / ranks_per_node * (1.0 + bubble) - 1.0)


def stage_split(num_layers: int, pp: int, head_layers: float) -> tuple[int, int]:
    """Blocks on the last pipeline rank (which also runs the LM head, worth ``head_layers`` blocks of time)
    and the most blocks on any other rank, for the split whose busiest rank is least loaded.

    The last rank takes ``k`` blocks plus the head, the other ``p-1`` ranks share the rest
    (``ceil((L-k)/(p-1))`` on the busiest); ``k`` balances ``k + head`` against that. With ``L`` divisible by
    ``p`` and a small head this is Megatron's uniform split (``L/p`` everywhere, head on the last); with a
    large vocabulary it is the balanced split DeepSpeed makes with ``partition_method:
    type:transformer|embedding`` (BLOOM-176B) and Megatron with ``--decoder-last-pipeline-num-layers``.
    Interleaving does not change it: a rank's ``v`` chunks together hold the same blocks.
    """
    if pp <= 1:
        return num_layers, 0
    ideal = (num_layers + head_layers) / pp
    best: tuple[float, int, int] = (math.inf, num_layers, 0)
    for k in (math.floor(ideal - head_layers), math.ceil(ideal - head_layers)):
        k = min(max(k, 0), num_layers)
        rest = math.ceil((num_layers - k) / (pp - 1))
        load = max(k + head_layers, rest)
        if load < best[0]:
            best = (load, k, rest)
    return best[1], best[2]


def rank_blocks(num_layers: int, plan: ParallelPlan, head_layers: float, *, mtp: int = 0) -> tuple[int, int]:
    """(blocks on the last rank, most blocks on any other rank) of the split the framework makes and the
    emitters write (``autotune/stagesplit.py``): equal chunks where PP x virtual stages divides the layers
    (Megatron's default: the last rank holds ``L / pp`` blocks and the LM head and loss besides, so it
    paces the pipeline; megatron/core/transformer/transformer_layer.py ``get_transformer_layer_offset``
    without ``--decoder-last-pipeline-num-layers`` or ``--account-for-loss-in-pipeline-split``), else the
    framework's uneven split; a rank's ``v`` chunks together. ``stage_split``'s head-balanced split only
    for a plan the framework cannot split (``check_plan`` says why). ``mtp``: multi-token prediction modules,
    which Megatron's layout counts on the last chunk (their time is in ``head_layers``)."""
    if plan.pp <= 1:
        return stage_split(num_layers, plan.pp, head_layers)
    try:
        split = split_layers(num_layers, plan, mtp=mtp)
    except ValueError:  # illegal plan: check_plan says why; price the balanced split
        return stage_split(num_layers, plan.pp, head_layers)
    layers, head = split.all_rank_layers(), split.head_rank  # the head on the last rank, or the first (V)
    return layers[head], max(layers[:head] + layers[head + 1 :])


def sends_s(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan) -> float:
    """Activation sends of the busiest pipeline rank per step: per micro-batch one forward and one backward
    send of ``b s h`` per model chunk (``2v``), blocking in Megatron's and torch's schedules. With TP each
    rank sends its ``1/tp`` slice (Narayanan et al. 2021 Sec. 4.1 scatter/gather; inherent with sequence
    parallelism). Where ``autotune probe`` measured the host time per action of torch's schedule
    (``HostProfile.pipeline_action_s``: a CPU device, where the schedule's bookkeeping and the wait on the
    neighbour's send are on the critical path: on 2 gloo ranks 0.28-0.35 ms per action of ``Schedule1F1B``
    and 0.70-0.76 ms of ``ScheduleInterleaved1F1B`` over 3 probes), that replaces the link's latency in each
    send."""
    if plan.pp <= 1:
        return 0.0
    link = comm.group_link(cluster, plan.pp, plan.tp * plan.cp * plan.dp)
    nbytes = plan.micro_batch * plan.seq_len / plan.cp * model.hidden_size * act_bytes(cluster) / plan.tp
    torch_schedule = plan.framework is Framework.FSDP  # Megatron's and DeepSpeed's schedules are their own
    host = cluster.gpu.host
    action_s = host.pipeline_action_s(plan.schedule.value) if torch_schedule else None
    if action_s is None and torch_schedule and plan.schedule.zero_bubble:  # profiled before this schedule:
        action_s = host.pipeline_action_s("interleaved")  # the same runtime, each send and receive an action
    chunks = plan.num_microbatches * plan.virtual_stages
    if action_s is None:
        return chunks * 2 * comm.p2p_s(nbytes, link)
    # the zero-bubble schedule's weight-gradient half is a third action per chunk, with nothing to send
    actions = 3 if plan.schedule.zero_bubble else 2
    return chunks * (actions * action_s + 2 * nbytes / link.bw_bytes_per_s)
