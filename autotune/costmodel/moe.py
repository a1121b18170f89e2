"""Mixture-of-Experts terms: where the routed experts live, what the token exchange costs, and how the grouped
expert GEMMs run.

Convention: per MoE block and micro-batch on ONE rank, averaged over the blocks of the model (``modelshape``
gives the per-block means: a model whose first ``k`` layers are dense pays ``(L - k) / L`` of an MoE block
per block). Dense models get 0 from every function here.

Layout (Megatron-Core MoE parallel folding, ``megatron/core/parallel_state.py`` ``initialize_model_parallel``
expert grid ``tp-ep-dp-pp`` with ``expert_tensor_parallel_size``; torchtitan ``parallel_dims.py`` sparse mesh
``pp, dp_replicate, efsdp, ep, etp``): a stage's ``tp x dp x cp`` ranks are re-tiled as ``etp x ep x
expert_dp`` for the experts, EP ranks ``etp`` apart (``expert_dp``: ``ParallelPlan.expert_shard_degree``;
an HSDP plan's replicas each hold a copy, so it counts the shard group only). Routed-expert weights are
split over ``ep x etp`` (not TP); their gradients and optimizer states are sharded over the
expert-data-parallel group (Megatron builds a separate distributed optimizer over ``expt_dp``,
``megatron/core/optimizer/__init__.py``).

Token dispatch is the all-to-all of Megatron's ``MoEAlltoAllTokenDispatcher`` (``token_dispatcher.py``) and
torchtitan's ``ExpertParallel`` (``all_to_all_single``): each rank sends its ``top-k`` token copies
(``h`` wide, 16-bit) to the experts' ranks and gets them back (dispatch + combine), in forward and again in
backward. What is modelled and what is fixed:

- dropless routing (Megatron's default ``--moe-expert-capacity-factor`` None; torchtitan), so no tokens are
  dropped or padded, unless the plan sets ``moe_capacity_factor`` ``c`` (GShard, Lepikhin et al. 2020;
  Switch, Fedus et al. 2021 Sec. 2.2): each expert then takes exactly ``c`` times the balanced load, padded
  (Megatron ``--moe-pad-expert-input-to-capacity``: ``token_dispatcher.py`` sends ``capacity`` rows per
  expert; DeepSpeed-MoE's einsum dispatch is ``[E, capacity, h]``), which scales the exchanged, computed and
  stored token copies by ``c`` (``busiest_load``);
- the busiest rank takes ``plan.moe_load_imbalance`` times the balanced ``tokens x top-k / E`` rows per
  expert (``busiest_load``; default 1, balanced): the auxiliary loss (Switch Sec. 2.2) or DeepSeek-V3's
  bias-based balancing (report Sec. 2.1.2) keep it near there, the framework performance tables force it,
  and a user who measured their router sets it;
- the exchange is exposed: neither framework overlaps it with compute by default (Megatron's
  ``--overlap-moe-expert-parallel-comm``, or DeepSeek's DualPipe, would hide it; not priced);
- ``plan.moe_dispatcher`` deepep / hybridep (Megatron's flex dispatcher) send a token once per destination
  node across nodes (``all_to_all_s``); inside a node they are priced as the all-to-all. ``allgather``
  (Megatron's ``MoEAllGatherTokenDispatcher``) gathers every token of the EP group to every rank and
  reduce-scatters the outputs back (``_gather_scatter_s``): ``(ep - 1)`` tokens' bytes per token where the
  all-to-all moves ``top-k (ep - 1) / ep``, so it wins only when ``ep`` is small against ``top-k``.
"""

from __future__ import annotations

import math

from autotune.costmodel import comm
from autotune.modelshape import routed_expert_params, routed_width_per_layer
from autotune.plan import Framework, MoeDispatcher, ParallelPlan, Recompute
from autotune.specs import ClusterSpec, ModelSpec

__all__ = [
    "GEMM_TILE_ROWS",
    "expert_params_per_gpu",
    "optimizer_shard_params",
    "tokens_per_expert",
    "busiest_load",
    "dispatch_buffer_width",
    "remote_nodes_per_token",
    "all_to_all_s",
    "dispatch_s",
    "routed_saved_h_tensors",
    "regroup_bytes_per_token",
]

GEMM_TILE_ROWS = 128
"""Rows of one output tile of a tensor-core GEMM (CUTLASS / cuBLAS 128 x 128 and 128 x 256 tiles on
A100/H100): a GEMM of ``M`` rows computes ``ceil(M / 128)`` tiles of rows (NVIDIA Deep Learning Performance
Guide, "Matrix Multiplication Background", tile quantization). Grouped expert GEMMs pay it per expert."""


def busiest_load(plan: ParallelPlan) -> float:
    """Routed token copies the busiest rank's experts take, over the balanced ``tokens x top-k / E``: padded
    to capacity, the capacity factor (no expert takes more, every expert takes that many); dropless, the
    user's ``moe_load_imbalance`` (1: balanced). Its expert GEMMs, its share of the exchange and its
    buffers are what the step waits for and what its peak holds."""
    return plan.moe_capacity_factor if plan.moe_capacity_factor is not None else plan.moe_load_imbalance


def dispatch_buffer_width(model: ModelSpec, plan: ParallelPlan) -> float:
    """Width per local token of one MoE block's dispatch buffers: the ``top-k`` routed copies an all-to-all
    receives (``busiest_load`` as many when padded); the all-gather dispatcher also holds the whole
    gathered group, ``ep x etp`` tokens per local one (``_gather_scatter_s``)."""
    if not model.is_moe:
        return 0.0
    width = model.experts_per_token * model.expert_width * busiest_load(plan)
    if plan.moe_dispatcher is MoeDispatcher.ALLGATHER and plan.ep > 1:
        width += plan.ep * plan.etp * model.expert_width
    return float(width)


def routed_saved_h_tensors(plan: ParallelPlan) -> int:
    """``h``-wide tensors one MoE block keeps for backward per routed token copy, beyond the expert MLP's
    ffn-wide intermediates. Megatron-Core: one, the permuted expert input that the first grouped GEMM saves
    for its weight gradient; the router probability multiplies inside the expert activation
    (``experts.py`` ``TEGroupedMLP`` with ``fusions/fused_bias_swiglu.py`` ``weighted_bias_swiglu_impl``), so
    no expert output is kept for the probability's gradient, and ``moe_utils.py`` ``permute`` / ``unpermute``
    save only indices. torchtitan (``models/moe/moe.py``, ``score_before_experts``) scales the routed input
    by the score before the experts: it keeps the unscaled copy for the score's gradient and the scaled one
    for the GEMM, two."""
    return 1 if plan.framework is Framework.MEGATRON else 2


def regroup_bytes_per_token(model: ModelSpec, plan: ParallelPlan) -> float:
    """Forward HBM bytes per token (mean block, one TP rank) of regrouping the received token copies by
    local expert around the all-to-all, beyond the permute/unpermute of
    ``flops.elementwise_bytes_per_token``. Megatron's ``MoEAlltoAllTokenDispatcher`` sorts the copies it
    receives from the EP ranks into per-expert chunks after the dispatch and restores the per-rank order
    before the combine (``token_dispatcher.py`` ``dispatch_postprocess`` / ``combine_preprocess``:
    ``moe_utils.py`` ``sort_chunks_by_idxs``, with ``--moe-permute-fusion`` too) whenever a rank holds more
    than one expert: two copies, each reading and writing every routed copy (16-bit). torchtitan's
    ``ExpertParallel`` regroups by ``generate_permute_indices`` the same way (``expert_parallel.py``)."""
    if not model.is_moe or plan.ep == 1 or model.num_experts // plan.ep < 2:
        return 0.0
    return 2 * 2 * 2 * routed_width_per_layer(model) * busiest_load(plan) / plan.tp


def expert_params_per_gpu(
    model: ModelSpec, plan: ParallelPlan, num_blocks: float, moe_blocks: float | None = None
) -> float:
    """Routed-expert parameters of ``num_blocks`` blocks on one GPU: split over ``ep x etp``; ``moe_blocks``
    of them MoE blocks where known (``stagestates.rank_moe_blocks``), else the model's share."""
    if moe_blocks is not None:
        return moe_blocks * routed_expert_params(model) / (plan.ep * plan.etp)
    return num_blocks * model.expert_params_per_layer / (plan.ep * plan.etp)


def optimizer_shard_params(model: ModelSpec, plan: ParallelPlan, params: float, num_blocks: float) -> float:
    """Parameters of this rank's optimizer shard: with ZeRO >= 1 the dense part over DP x CP, routed experts
    over the expert-data-parallel group (module docstring); all of ``params`` without sharding."""
    if plan.zero_stage < 1:
        return params
    experts = expert_params_per_gpu(model, plan, model.num_layers if plan.pp == 1 else num_blocks)
    return (params - experts) / (plan.shard_degree * plan.cp) + experts / plan.expert_shard_degree


def tokens_per_expert(model: ModelSpec, plan: ParallelPlan, tokens: float) -> float:
    """Rows of one expert's GEMM on one rank when each rank of the stage holds ``tokens / tp`` tokens
    (sequence parallel): the EP group's ``top-k`` copies spread over the ``E`` experts, gathered over ETP."""
    return plan.ep * plan.etp * tokens / plan.tp * model.experts_per_token / model.num_experts


def remote_nodes_per_token(model: ModelSpec, nodes: int) -> float:
    """Expected number of OTHER NVLink domains a token's ``top-k`` experts sit in, when the ``E`` routed
    experts are spread evenly over ``nodes`` domains and routing is balanced (each token draws ``k``
    distinct experts uniformly): ``(N - 1) (1 - C(E - E/N, k) / C(E, k))``, the chance that a given other
    domain holds none of them being the hypergeometric ``C(E - E/N, k) / C(E, k)``."""
    if nodes <= 1:
        return 0.0
    e, k = model.num_experts, model.experts_per_token
    return (nodes - 1) * (1.0 - math.comb(e - e // nodes, k) / math.comb(e, k))


def all_to_all_s(
    nbytes: float, cluster: ClusterSpec, size: int, stride: int, node_copies: float | None = None
) -> float:
    """One all-to-all in which each of ``size`` ranks (``stride`` apart) sends ``nbytes`` spread evenly over
    the group (``(n-1)/n`` of it leaves the rank). Peers in the same node get theirs over NVLink, the others
    over the node's NICs, shared by the node's GPUs (all exchange at once); the two run concurrently
    (NCCL ``ncclSend``/``ncclRecv`` to every peer in one group call), so the slower one sets the time, plus
    one latency of the slowest hop. DeepSeek-V3 report Sec. 3.2.2 prices its dispatch the same way: bound by
    the IB share (50 GB/s) while NVLink (160 GB/s) carries the rest. "Node" is the NVLink domain
    (``ClusterSpec.nvlink_domain``: 72 GPUs of a GB200 NVL72 rack), the NIC share is per GPU.

    ``node_copies`` (DeepEP / HybridEP, Megatron's flex dispatcher): the share of ``nbytes`` that crosses
    the NICs when a token goes once to each destination domain, to the GPU of the same local index, which
    forwards it over NVLink to the experts' GPUs there (DeepSeek-V3 report Sec. 3.2.2; DeepEP README,
    "normal kernels": NVLink-to-RDMA forwarding). NVLink then also carries the forwarded copies, the
    ``(k-1)/k`` of the remote ones that land on another GPU than their expert's."""
    if size <= 1:
        return 0.0
    per_node, domain = cluster.gpus_per_node, cluster.nvlink_domain
    k = 1 if stride >= domain else max(1, min(size, domain // stride))
    eff = cluster.collective_efficiency
    remote = (size - k) / size
    nvlink = (k - 1) / size + (remote * (k - 1) / k if node_copies is not None else 0.0)
    intra_s = nbytes * nvlink / (cluster.intra_link.bw_bytes_per_s * eff)
    if k >= size:
        return intra_s + cluster.intra_link.latency_s
    nic = cluster.nics_per_node * cluster.inter_link.bw_bytes_per_s / per_node * eff
    inter_s = nbytes * (remote if node_copies is None else node_copies) / nic
    return max(intra_s, inter_s) + max(cluster.intra_link.latency_s, cluster.inter_link.latency_s)


def dispatch_s(
    model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, tokens: float, act_bytes: int
) -> float:
    """Exposed all-to-all seconds of one (mean) block per micro-batch: dispatch and combine in forward and
    in backward (4), 2 more when full recompute, or Megatron's ``--recompute-modules moe`` (the MoE layer
    checkpointed whole, ``transformer_layer.py``), reruns the forward; each moves this rank's ``tokens / tp``
    tokens x ``top-k`` copies of ``h`` (``modelshape.routed_width_per_layer``), ``busiest_load`` times that
    for the busiest rank (padded to capacity, or the user's measured imbalance); Megatron's all-gather
    dispatcher moves the whole group's tokens instead (``_gather_scatter_s``)."""
    if not model.is_moe or plan.ep == 1:
        return 0.0
    rerun = plan.recompute is Recompute.FULL or "moe" in plan.recompute_modules
    calls = 4 + (2 if rerun else 0)
    share = len(model.moe_layers) / model.num_layers
    if plan.moe_dispatcher is MoeDispatcher.ALLGATHER:
        return calls / 2 * share * _gather_scatter_s(model, cluster, plan, tokens, act_bytes)
    nbytes = tokens / plan.tp * routed_width_per_layer(model) * busiest_load(plan) * act_bytes
    one = all_to_all_s(
        nbytes / share,
        cluster,
        plan.ep,
        plan.etp,  # bytes of one MoE block
        node_copies=_node_copies(model, cluster, plan),
    )
    return calls * share * one


ROUTING_BYTES_PER_EXPERT = 5.0
"""Per token and expert, what the all-gather dispatcher gathers besides the hidden state: the boolean
routing map (1 B) and the fp32 probabilities (4 B) (``MoEAllGatherTokenDispatcher.token_permutation``)."""


def _gather_scatter_s(
    model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, tokens: float, act_bytes: int
) -> float:
    """One all-gather and one reduce-scatter of Megatron's ``MoEAllGatherTokenDispatcher``
    (``token_dispatcher.py``): the ``ep x etp`` ranks of the expert tensor-and-model-parallel group
    (consecutive ranks) gather every token of the group, with its routing map and probabilities, keep the
    copies routed to their local experts, and reduce-scatter the group-sized output back; the backward runs
    the pair the other way. Unlike the all-to-all, every token crosses to every rank, whatever ``top-k``."""
    group = plan.ep * plan.etp
    link = comm.group_link(cluster, group, 1)
    local = tokens / plan.tp
    hidden = group * local * model.expert_width * act_bytes
    routing = group * local * model.num_experts * ROUTING_BYTES_PER_EXPERT
    return comm.allgather_s(hidden + routing, group, link) + comm.reduce_scatter_s(hidden, group, link)


def _node_copies(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan) -> float | None:
    """With a node-forwarding dispatcher (``all_to_all_s``): the share of a rank's ``top-k`` routed copies
    that cross the NICs, one per other destination domain (``remote_nodes_per_token`` over ``top-k``);
    None for the plain all-to-all."""
    if plan.moe_dispatcher in (MoeDispatcher.ALLTOALL, MoeDispatcher.ALLGATHER):
        return None
    domain = cluster.nvlink_domain
    k = 1 if plan.etp >= domain else max(1, min(plan.ep, domain // plan.etp))
    return remote_nodes_per_token(model, -(-plan.ep // k)) / model.experts_per_token
