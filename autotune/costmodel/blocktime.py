"""Time of one transformer block for one micro-batch on one GPU, by cause (``BlockTimes``).

Split out of ``steptime``, which multiplies these by the blocks and micro-batches of the busiest pipeline
rank and adds the step-level terms; the conventions (rank order, where each term's constant lives) are in
``steptime``'s docstring.
"""

from __future__ import annotations

from typing import NamedTuple

from autotune.costmodel import actoffload, comm, compute, cpcomm, epoverlap, flops, moe, moehost, ncclsm
from autotune.costmodel.hostops import block_host_s, edge_host_s
from autotune.costmodel.lossbytes import loss_bytes_per_vocab
from autotune.costmodel.overlap import DP_OVERLAP_FRACTION, dp_overlap_fraction
from autotune.costmodel.recompute_modules import rerun_s as modules_rerun_s
from autotune.costmodel.states import vocab_split
from autotune.costmodel.tpcomm import (
    act_bytes,
    block_collectives,
    edge_collectives_s,
    kv_replica_gather_s,
    reduction_s,
)
from autotune.plan import Framework, ParallelPlan, Recompute
from autotune.specs import ClusterSpec, ModelSpec

__all__ = ["BlockTimes", "block_times", "recomputed_share", "ELEMENTWISE_BWD_FACTOR"]

ELEMENTWISE_BWD_FACTOR = 1.5
"""Backward/forward HBM traffic of elementwise kernels: the backward of ``y = f(x)`` reads ``x`` (or ``y``)
and ``dy`` and writes ``dx`` (3 tensors) where the forward read 1 and wrote 1."""


class BlockTimes(NamedTuple):
    """One transformer block, one micro-batch, one GPU (seconds); ``head_s`` is the LM head's."""

    gemm_s: float
    """Forward GEMMs."""
    attn_s: float
    """Forward attention core (``QK^T``, ``PV``)."""
    attn_bwd_s: float
    """Backward of the attention core: 2x its forward FLOPs, slower per FLOP with FlashAttention."""
    ew_s: float
    """Forward memory-bound kernels (norms, residuals, activation; softmax/dropout without FlashAttention)."""
    recompute_s: float
    """Recomputed forward work (full: the whole block; selective: the attention core)."""
    tp_s: float
    """Exposed TP collectives: 2 in forward, 2 in backward, 2 more in a fully recomputed forward."""
    cp_s: float
    """Exposed ring-attention K/V exchange."""
    head_s: float
    """LM head forward + backward and its loss (on the last pipeline rank only)."""
    head_tp_s: float = 0.0
    """TP collectives of the LM head and loss (last pipeline rank; ``tpcomm.edge_collectives_s``)."""
    embed_tp_s: float = 0.0
    """TP collectives of the embedding (first pipeline rank)."""
    host_s: float = 0.0
    """Host time of the block's eager operators where the device does not hide it (``hostops``; 0 on GPUs)
    and what the MoE dispatcher's host sync exposes (``moe_sync_s``)."""
    edge_host_s: float = 0.0
    """The same for the embedding, head and loss (charged to the last pipeline rank)."""
    ep_s: float = 0.0
    """Exposed expert-parallel all-to-all of the block (``moe.dispatch_s``)."""
    offload_s: float = 0.0
    """Exposed copies of activation offloading, fine-grained or of whole layers (``actoffload``)."""
    moe_sync_s: float = 0.0
    """The MoE dispatcher's share of ``host_s`` (``moehost``): the GPU idles through it, waiting for the
    host's next kernel, so the DP collectives already queued on their own streams run then too."""

    @property
    def fwd_s(self) -> float:
        return self.gemm_s + self.attn_s + self.ew_s

    @property
    def bwd_s(self) -> float:
        """2 x the forward GEMM FLOPs, ``attn_bwd_s``, and elementwise backward kernels moving
        ``ELEMENTWISE_BWD_FACTOR`` x the forward bytes."""
        return 2 * self.gemm_s + self.attn_bwd_s + ELEMENTWISE_BWD_FACTOR * self.ew_s

    @property
    def total_s(self) -> float:
        return (
            self.fwd_s
            + self.bwd_s
            + self.recompute_s
            + self.tp_s
            + self.cp_s
            + self.host_s
            + self.ep_s
            + self.offload_s
        )


def _tp_exposed_s(
    one_s: float,
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: ParallelPlan,
    wgrad_s: float,
    overlap: bool,
    overlap_fraction: float = DP_OVERLAP_FRACTION,
) -> float:
    """TP collectives of one block, each an all-reduce of ``b s h`` or with sequence parallelism an all-gather
    and reduce-scatter pair (``tpcomm.reduction_s``); how many per framework: ``tpcomm.block_collectives``.
    Forward ones sit between dependent GEMMs and are exposed. With ``overlap`` the backward ones run under
    the weight-gradient GEMMs (Megatron-LM's async TP all-reduce, since commit 16c90445e7, 2021-09), up to
    ``DP_OVERLAP_FRACTION`` of them. ``plan.tp_comm_overlap`` (Transformer Engine userbuffers:
    ``ub_overlap_ag``, ``ub_overlap_rs``, ``ub_overlap_rs_dgrad``, ``ub_bulk_wgrad``) splits each collective
    and pipelines it with the GEMM it feeds, forward and backward. ``plan.async_tp`` (torch micro-pipelined
    TP: inductor's ``micro_pipeline_tp`` pass fuses the forward graph's all-gather -> matmul and matmul ->
    reduce-scatter into ``fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``) is priced as hiding
    the forward ones only, the backward keeping plain collectives: an assumption, not a measurement
    (torchtitan's async-TP benchmark gains 1.04-1.16x on H100, not the ~1.3x that hiding all would give)."""
    fwd_n, bwd_n = block_collectives(model, plan)
    fwd_hidden = max(0.0, fwd_n * one_s - overlap_fraction * wgrad_s * fwd_n / 2)  # recompute: 2 forwards
    if plan.tp_comm_overlap:
        return fwd_hidden + max(0.0, bwd_n * one_s - overlap_fraction * 2 * wgrad_s)
    if plan.async_tp and str(plan.fp8_recipe) == "rowwise" and str(plan.precision) == "fp8":
        # pytorch/pytorch#149990: with rowwise scales inductor fuses matmul -> reduce-scatter but not the
        # all-gather -> matmul, so only the forward reduce-scatters (half the forward collectives) hide
        return (
            fwd_n / 2 * one_s
            + max(0.0, fwd_n / 2 * one_s - overlap_fraction * wgrad_s * fwd_n / 4)
            + bwd_n * one_s
        )
    if plan.async_tp:
        return fwd_hidden + bwd_n * one_s
    if overlap:  # NCCL kernels, holding their SMs while hidden (``ncclsm``)
        bwd_exposed = max(0.0, bwd_n * one_s - overlap_fraction * wgrad_s)
        return fwd_n * one_s + bwd_exposed + ncclsm.hidden_comm_sm_s(cluster, bwd_n * one_s - bwd_exposed)
    return (fwd_n + bwd_n) * one_s


def block_times(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: ParallelPlan,
    *,
    flash_attention: bool = True,
    tp_backward_overlap: bool | None = None,
    attention_kernel: str | None = None,
) -> BlockTimes:
    """Per-block, per-micro-batch times on one GPU: ``FLOPs / (peak x gemm_efficiency)`` for GEMMs and
    attention, ``bytes / (HBM x HBM_EFFICIENCY)`` for the elementwise kernels (``flops`` module); the sequence
    is split over CP, weights over TP. Software switches (defaults: today's frameworks):
    ``flash_attention=False`` models pre-2022 kernels that materialise the ``s x s`` scores (no causal
    skipping, ``flops.SCORE_BYTES`` of traffic per score); ``tp_backward_overlap`` (default: Megatron only)
    hides backward TP collectives under GEMMs."""
    hbm_rate = compute.hbm_rate(cluster)
    tp, s = plan.tp, plan.seq_len
    tokens = plan.micro_batch * s / plan.cp
    gemm_s = compute.block_gemm_s(model, cluster, plan, tokens)
    attn_s, attn_bwd_s = compute.attention_s(
        model, cluster, plan, tokens, flash=flash_attention, kernel=attention_kernel
    )
    ew_bytes = flops.elementwise_bytes_per_token(
        model, tp=tp, sequence_parallel=plan.sequence_parallel
    ) + compute.eager_extra_bytes_per_token(model, cluster, plan)
    score_s = 0.0 if flash_attention else tokens * flops.score_bytes_per_token(model, s, tp=tp) / hbm_rate
    ew_s = tokens * (ew_bytes + moe.regroup_bytes_per_token(model, plan)) / hbm_rate + score_s
    recompute = plan.recompute
    recompute_s = (
        recomputed_share(model, plan) * (gemm_s + attn_s + ew_s)
        if recompute is Recompute.FULL
        else 0.0
        if recompute is not Recompute.SELECTIVE
        else attn_s + score_s
        if plan.framework is not Framework.FSDP  # torchtitan: op SAC, not Megatron's selective
        else compute.op_sac_recompute_s(model, cluster, plan, tokens, ew_s - score_s)
    )
    modules_s = modules_rerun_s(model, cluster, plan, tokens, attn_s + score_s)  # --recompute-modules
    recompute_s = recompute_s if modules_s is None else modules_s
    tp_s = 0.0
    if tp > 1:
        hidden_bytes = tokens * model.hidden_size * act_bytes(cluster)
        # an fp8 all-gather moves half the bytes of its bf16 reduce-scatter partner (compute.fp8_tp_gather)
        one = reduction_s(
            hidden_bytes * (0.75 if compute.fp8_tp_gather(plan) else 1.0),
            plan,
            comm.group_link(cluster, tp, 1),
        )
        overlap = plan.framework is Framework.MEGATRON if tp_backward_overlap is None else tp_backward_overlap
        tp_s = _tp_exposed_s(one, model, cluster, plan, gemm_s, overlap, dp_overlap_fraction(cluster))
        tp_s += kv_replica_gather_s(model, cluster, plan, tokens)
    loss_bytes = loss_bytes_per_vocab(plan) + compute.eager_loss_extra_bytes_per_vocab(cluster, plan)
    head_s = 3 * compute.head_gemm_s(
        model, cluster, vocab_split(plan), tokens
    ) + tokens * loss_bytes * model.vocab_size / hbm_rate / vocab_split(plan)
    cp_s = cpcomm.cp_exposed_s(model, cluster, plan, tokens, attn_s, attn_bwd_s)
    embed_tp_s, head_tp_s = edge_collectives_s(model, cluster, plan, tokens)
    bt = BlockTimes(
        gemm_s,
        attn_s,
        attn_bwd_s,
        ew_s,
        recompute_s,
        tp_s,
        cp_s,
        head_s,
        head_tp_s,
        embed_tp_s,
        block_host_s(model, cluster, plan),
        edge_host_s(model, cluster, plan),
        ep_s=moe.dispatch_s(model, cluster, plan, tokens, act_bytes(cluster)),
    )
    if plan.moe_a2a_overlap:
        bt = bt._replace(ep_s=_overlapped_ep_s(model, cluster, plan, bt, tokens))
    offload = actoffload.block_exposed_s(model, cluster, plan, *_device_s(bt))
    bt = bt._replace(offload_s=sum(offload))
    sync_s = _moe_host_s(model, plan, bt, offload)
    return bt._replace(host_s=bt.host_s + sync_s, moe_sync_s=sync_s)


def _overlapped_ep_s(
    model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, bt: BlockTimes, tokens: float
) -> float:
    """The block's exchange under Megatron's EP overlap (``epoverlap``): device time as ``_device_s``
    splits it, the TP/CP time counted with the attention (pre-dispatch) node."""
    comm = bt.tp_s + bt.cp_s
    fwd_s, bwd_s = _device_s(bt)
    return epoverlap.exposed_ep_s(
        model,
        cluster,
        plan,
        ep_s=bt.ep_s,
        fwd_s=fwd_s,
        bwd_s=bwd_s,
        attn_fwd_s=bt.attn_s + comm / 3,
        attn_bwd_s=bt.attn_bwd_s + 2 * comm / 3,
        routed=epoverlap.routed_share(model, cluster, plan, tokens),
    )


def _moe_host_s(model: ModelSpec, plan: ParallelPlan, bt: BlockTimes, offload: tuple[float, float]) -> float:
    """What the per-layer host sync of the MoE dispatcher exposes (``moehost``), against the block's device
    time (``_device_s``), the token exchange split by its calls (2 of 4, or of 6 with full recompute) and the
    (forward, backward) offload copies the device waits for (``actoffload``): the host issues on meanwhile,
    so a layer takes the longer of the host's time and the device's with its waits, not their sum less the
    device's twice."""
    ep_fwd = bt.ep_s * (2 / 6 if plan.recompute is Recompute.FULL else 0.5)
    fwd_s, bwd_s = _device_s(bt)
    return moehost.exposed_s(model, plan, fwd_s + ep_fwd + offload[0], bwd_s + bt.ep_s - ep_fwd + offload[1])


def _device_s(bt: BlockTimes) -> tuple[float, float]:
    """(forward, backward) device seconds of the block without its token exchange: forward work and a third
    of its TP/CP time; the rest, the backward work and the recompute in backward."""
    comm = bt.tp_s + bt.cp_s
    return bt.fwd_s + comm / 3, bt.bwd_s + bt.recompute_s + 2 * comm / 3


def recomputed_share(model: ModelSpec, plan: ParallelPlan) -> float:
    """Share of blocks a full recompute reruns: all, or ``recompute_layers`` of each model chunk
    (Megatron ``--recompute-method block``)."""
    if plan.recompute_layers is None:
        return 1.0
    return min(1.0, plan.recompute_layers * plan.virtual_stages * plan.pp / model.num_layers)
