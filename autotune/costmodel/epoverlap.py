"""Megatron's EP all-to-all overlap: what ``--overlap-moe-expert-parallel-comm --delay-wgrad-compute``
leaves exposed of a MoE block's token exchange (``plan.moe_a2a_overlap``).

In the steady state of the schedule Megatron runs the forward of one micro-batch and the backward of
another together, layer by layer ("combined 1F1B": megatron/core/pipeline_parallel/combined_1f1b.py;
one layer: megatron/core/models/common/model_chunk_schedule_plan.py ``schedule_layer_1f1b`` / ``run``).
A MoE layer is four nodes, the all-to-alls on a communication stream and the rest on the compute stream:

    comm:  combine bwd (B) | dispatch fwd (F) -> dispatch bwd (B)       | combine fwd (F)
    comp:  pre-dispatch (F) | expert MLP dgrad (B) -> wgrad (B) -> MLP (F) | pre-dispatch bwd (B)

"pre-dispatch" is attention, the pre-MLP norm, shared experts, router and dispatch preprocess
(megatron/core/models/gpt/fine_grained_callables.py); the MLP node the routed experts' grouped GEMMs.
``layer_pair_s`` walks that order with its data dependencies, each all-to-all a quarter of the block's
exchange. The all-to-alls that run beside compute hold SMs meanwhile (``ncclsm``). Only the steady state
overlaps: with PP = 1, ``m - 1`` of ``m`` micro-batches (the first forward and last backward run alone);
interleaved, all chunk steps but the warm-up's ``2(pp - 1) + (v - 1) pp + 1`` (``schedules.py``
``get_pp_rank_microbatches``: the overlap adds one warm-up micro-batch), on the first pipeline rank.

Memory: the forward and the backward advance in lockstep, one layer saved as one is freed, so a rank
holds what the plain schedule holds (the warm-up's extra forward stands for the plain schedule's forward in
progress), plus one layer's transient, not priced.

Not priced: the ``CUDA_DEVICE_MAX_CONNECTIONS`` trade-off Megatron warns of on Hopper with TP or CP > 1
(``megatron/training/arguments.py``), the elementwise split between the nodes (taken in proportion to
their GEMM time), and host time (``moehost``, unchanged).
"""

from __future__ import annotations

from typing import NamedTuple

from autotune.costmodel import gemms, kernels, ncclsm
from autotune.plan import Framework, ParallelPlan, Schedule
from autotune.specs import ClusterSpec, ModelSpec

__all__ = ["LayerWork", "layer_pair_s", "overlapped_share", "routed_share", "exposed_ep_s"]


class LayerWork(NamedTuple):
    """Compute seconds of one MoE layer and micro-batch by node (``a2a_s``: one all-to-all)."""

    pre_fwd_s: float
    mlp_fwd_s: float
    pre_bwd_s: float
    mlp_dgrad_s: float
    mlp_wgrad_s: float
    a2a_s: float

    @property
    def compute_s(self) -> float:
        return self.pre_fwd_s + self.mlp_fwd_s + self.pre_bwd_s + self.mlp_dgrad_s + self.mlp_wgrad_s


def layer_pair_s(w: LayerWork) -> float:
    """Seconds of one layer's forward (F) and another micro-batch's backward (B) of the same layer run as
    ``schedule_layer_1f1b`` orders them (module docstring): never less than either stream's total."""
    x = w.a2a_s
    start = max(x, w.pre_fwd_s)  # combine bwd (B) beside pre-dispatch (F)
    dispatch_fwd = start + x
    dgrad = start + w.mlp_dgrad_s
    dispatch_bwd = max(dispatch_fwd, dgrad) + x
    mlp_fwd = max(dgrad + w.mlp_wgrad_s, dispatch_fwd) + w.mlp_fwd_s
    combine_fwd = max(dispatch_bwd, mlp_fwd) + x
    pre_bwd = max(mlp_fwd, dispatch_bwd) + w.pre_bwd_s
    return max(combine_fwd, pre_bwd)


def overlapped_share(plan: ParallelPlan) -> float:
    """Share of a rank's micro-batch forwards that run overlapped (module docstring)."""
    m, pp, v = plan.num_microbatches, plan.pp, plan.virtual_stages
    if pp == 1:
        return (m - 1) / m
    if plan.schedule is not Schedule.INTERLEAVED:
        return 0.0
    warmup = 2 * (pp - 1) + (v - 1) * pp + 1
    return max(0, m * v - warmup) / (m * v)


def routed_share(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, tokens: float) -> float:
    """Share of the mean block's forward GEMM seconds in the routed experts (``gemms.routed_expert_gemms``)
    on an MoE layer, i.e. the MLP node's."""
    gpu, precision = cluster.gpu, str(plan.precision)
    fused = plan.framework is Framework.MEGATRON

    def seconds(shapes: list[gemms.Gemm]) -> float:
        return sum(g.count * kernels.gemm_s(gpu, precision, g.m, g.n, g.k) for g in shapes)

    total = seconds(gemms.block_gemms(model, plan, tokens, fused=fused))
    moe_share = len(model.moe_layers) / model.num_layers
    return seconds(gemms.routed_expert_gemms(model, plan, tokens)) / total / moe_share if total else 0.0


def exposed_ep_s(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: ParallelPlan,
    *,
    ep_s: float,
    fwd_s: float,
    bwd_s: float,
    attn_fwd_s: float,
    attn_bwd_s: float,
    routed: float,
) -> float:
    """Exposed exchange seconds of the mean block per micro-batch under the overlap: the block's
    ``ep_s`` (``moe.dispatch_s``, four all-to-alls) less what the overlapped share of micro-batches hides
    (half a layer pair per micro-batch), plus the SMs the hidden all-to-alls take. ``fwd_s`` / ``bwd_s``
    are the block's compute, ``attn_*`` the attention core and TP/CP time (pre-dispatch node), ``routed``
    the MLP node's share of the rest (``routed_share``); the expert backward splits evenly into data and
    weight gradients (``--delay-wgrad-compute``)."""
    moe_share = len(model.moe_layers) / model.num_layers
    if not plan.moe_a2a_overlap or ep_s <= 0 or moe_share <= 0:
        return ep_s
    mlp_fwd, mlp_bwd = routed * (fwd_s - attn_fwd_s), routed * (bwd_s - attn_bwd_s)
    work = LayerWork(
        pre_fwd_s=fwd_s - mlp_fwd,
        mlp_fwd_s=mlp_fwd,
        pre_bwd_s=bwd_s - mlp_bwd,
        mlp_dgrad_s=mlp_bwd / 2,
        mlp_wgrad_s=mlp_bwd / 2,
        a2a_s=ep_s / moe_share / 4,
    )
    serial = work.compute_s + 4 * work.a2a_s
    pair = layer_pair_s(work)
    hidden = serial - pair
    saved = overlapped_share(plan) * moe_share * hidden / 2
    return ep_s - saved + ncclsm.hidden_comm_sm_s(cluster, saved)
