"""Time of one optimizer step on the critical path: the busiest pipeline rank of one replica.

Convention: per-GPU work is that of the most-loaded pipeline rank (``pipeline.rank_blocks``); collectives are
timed by ``comm`` on the links ``comm.group_link`` assigns from the rank order ``pp, dp, cp, tp`` (outer to
inner: TP stride 1, CP stride ``tp``, DP stride ``tp*cp``, PP stride ``tp*cp*dp``). Every term is one small
function citing its source; the overhead constants below and in ``offload`` are the only knobs besides the
per-GPU ``gemm_efficiency`` in ``data/hardware.yaml``, and none is per model or per run. A probe profile or a
calibration (``autotune.calibrate``) changes the calibratable ones as data, never as module globals:
``GPUSpec.gemm_efficiency``, ``ClusterSpec.collective_efficiency``, ``dp_overlap_fraction``,
``step_overhead_s`` and ``microbatch_overhead_s``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple

from autotune.costmodel import comm, compute, cpcomm, flops, fsdpcopy, moe, moehost, ncclsm, pipeline, tpcomm
from autotune.costmodel.dpcomm import collective_calls as dp_collective_calls
from autotune.costmodel.dpcomm import dp_comm_s, zero3_gathers
from autotune.costmodel.gradbuffer import megatron_grad_buffer_s
from autotune.costmodel.hostops import block_host_s, edge_host_s, fsdp_host_s, zero3_host_s
from autotune.costmodel.kernels import HBM_EFFICIENCY
from autotune.costmodel.lossbytes import loss_bytes_per_vocab
from autotune.costmodel.offload import (
    HOST_ACCUMULATE_BYTES_PER_PARAM,
    HOST_OPTIMIZER_BYTES_PER_S,
    OPTIMIZER_BYTES_PER_PARAM,
    PCIE_BYTES_PER_S,
    TORCH_CPU_ADAMW_BYTES_PER_PARAM,
    HostTraffic,
    gpus_sharing_host,
    host_traffic,
    optimizer_s,
)
from autotune.costmodel.recompute_modules import rerun_s as modules_rerun_s
from autotune.costmodel.states import vocab_split
from autotune.costmodel.tpcomm import act_bytes, block_collectives, edge_collectives_s, reduction_s
from autotune.plan import Framework, ParallelPlan, Recompute
from autotune.specs import ClusterSpec, ModelSpec

__all__ = [
    "TimeBreakdown",
    "BlockTimes",
    "HostTraffic",
    "block_times",
    "host_traffic",
    "step_time",
    "OPTIMIZER_BYTES_PER_PARAM",
    "TORCH_CPU_ADAMW_BYTES_PER_PARAM",
    "HOST_OPTIMIZER_BYTES_PER_S",
    "PCIE_BYTES_PER_S",
    "HOST_ACCUMULATE_BYTES_PER_PARAM",
    "HBM_EFFICIENCY",
]

DP_OVERLAP_FRACTION = 0.8
"""Share of the overlappable compute window during which DP/ZeRO/FSDP collectives run hidden. Below 1 because
NCCL kernels take SMs and HBM bandwidth from the GEMMs they hide behind (PyTorch DDP paper, Li et al. 2020,
Sec. 5: overlap recovers most but not all communication time). The first gather / last reduce of a window is
always exposed (see ``_exposed_s``)."""
ELEMENTWISE_BWD_FACTOR = 1.5
"""Backward/forward HBM traffic of elementwise kernels: the backward of ``y = f(x)`` reads ``x`` (or ``y``)
and ``dy`` and writes ``dx`` (3 tensors) where the forward read 1 and wrote 1."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TimeBreakdown:
    """Seconds per optimizer step on the critical path, by cause. ``step_time_s`` is their sum."""

    compute_s: float
    """Forward + backward GEMMs and attention of all micro-batches on one stage (no recompute)."""
    recompute_s: float
    """Extra forward work of activation recomputation."""
    tp_comm_s: float
    """Exposed TP all-reduce / all-gather + reduce-scatter (with SP, and SP's norm gradients)."""
    cp_comm_s: float
    """Exposed context-parallel K/V exchange."""
    pp_p2p_s: float
    """Pipeline point-to-point activation/gradient sends on the critical path (``pipeline.sends_s``; where
    the device's host time per schedule action is measured, each send costs that, not the link latency)."""
    pp_bubble_s: float
    """Pipeline fill/drain idle time."""
    dp_comm_s: float
    """Exposed (not overlapped with backward) DP all-reduce / ZeRO/FSDP gathers and reduce-scatters."""
    optimizer_s: float
    """Optimizer step (memory-bound) on GPU or host."""
    offload_s: float
    """Exposed host<->device copies of offload (``host_traffic``) and host-side gradient accumulation."""
    model_flops: float
    """Model FLOPs per step over all GPUs (6N-style + attention, no recompute): the MFU numerator."""
    hardware_flops: float
    """FLOPs actually executed per step over all GPUs (with recompute): the HFU numerator."""
    dp_comm_total_s: float = 0.0
    """DP communication including the part hidden behind backward (for reports)."""
    ep_comm_s: float = 0.0
    """Exposed expert-parallel all-to-all token dispatch and combine (``costmodel.moe``)."""
    overhead_s: float = 0.0
    """Fixed per-step and per-micro-batch overhead (``ClusterSpec.step_overhead_s`` + micro-batches x
    ``microbatch_overhead_s``; 0 unless calibrated from trials) and, where the device does not hide it, the
    host time of the eager and DTensor operators and of DeepSpeed ZeRO-3's hooks (``hostops``; 0 on GPUs),
    and the host time a Megatron MoE layer's host sync exposes (``moehost``, on GPUs too)."""

    @property
    def step_time_s(self) -> float:
        return (
            self.compute_s
            + self.recompute_s
            + self.tp_comm_s
            + self.cp_comm_s
            + self.pp_p2p_s
            + self.pp_bubble_s
            + self.dp_comm_s
            + self.optimizer_s
            + self.offload_s
            + self.overhead_s
            + self.ep_comm_s
        )

    def as_dict(self) -> dict[str, float]:
        d = asdict(self)
        d["step_time_s"] = self.step_time_s
        return d


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
    """Host time of the block's eager operators where the device does not hide it (``hostops``; 0 on GPUs)."""
    edge_host_s: float = 0.0
    """The same for the embedding, head and loss (charged to the last pipeline rank)."""
    ep_s: float = 0.0
    """Exposed expert-parallel all-to-all of the block (``moe.dispatch_s``)."""

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
        return self.fwd_s + self.bwd_s + self.recompute_s + self.tp_s + self.cp_s + self.host_s + self.ep_s


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
        tp_s = _tp_exposed_s(one, model, cluster, plan, gemm_s, overlap, _overlap_fraction(cluster))
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
    return bt._replace(host_s=bt.host_s + _moe_host_s(model, plan, bt))


def _moe_host_s(model: ModelSpec, plan: ParallelPlan, bt: BlockTimes) -> float:
    """What the per-layer host sync of the MoE dispatcher exposes (``moehost``), against the block's device
    time: forward work and a third of its TP/CP time, the rest and the recompute in backward; the token
    exchange split by its calls (2 of 4, or of 6 with full recompute)."""
    ep_fwd = bt.ep_s * (2 / 6 if plan.recompute is Recompute.FULL else 0.5)
    comm = bt.tp_s + bt.cp_s
    return moehost.exposed_s(
        model, plan, bt.fwd_s + comm / 3 + ep_fwd, bt.bwd_s + bt.recompute_s + 2 * comm / 3 + bt.ep_s - ep_fwd
    )


def _overlap_fraction(cluster: ClusterSpec) -> float:
    """The cluster's calibrated overlap, else ``DP_OVERLAP_FRACTION``; 0 on a device whose frameworks issue
    collectives synchronously (``GPUSpec.async_collectives``)."""
    if not cluster.gpu.async_collectives:
        return 0.0
    return DP_OVERLAP_FRACTION if cluster.dp_overlap_fraction is None else cluster.dp_overlap_fraction


def _exposed_s(
    comm_s: float, window_s: float, pieces: int, overlap_fraction: float = DP_OVERLAP_FRACTION
) -> float:
    """Communication left on the critical path when it may hide behind ``window_s`` of compute: at least one
    piece (the first gather / last reduce-scatter bucket of the window has nothing to overlap), else what
    ``DP_OVERLAP_FRACTION`` of the window cannot cover."""
    return max(comm_s / max(1, pieces), comm_s - overlap_fraction * window_s)


def _rank_params(model: ModelSpec, plan: ParallelPlan, blocks: int) -> float:
    """Parameters held by the most-loaded GPU: its blocks split over TP, plus the embedding / LM head on a
    pipeline end (split as ``states.vocab_split``); with PP=1 the whole model."""
    ends = model.embedding_params if plan.pp == 1 else model.vocab_size * model.hidden_size
    body = model.num_params - model.embedding_params if plan.pp == 1 else blocks * model.params_per_layer
    experts = (model.num_layers if plan.pp == 1 else blocks) * model.expert_params_per_layer
    return (body - experts) / plan.tp + experts / (plan.ep * plan.etp) + ends / vocab_split(plan)


def _offload_s(
    cluster: ClusterSpec,
    plan: ParallelPlan,
    traffic: HostTraffic,
    dp_per_mb_s: float,
    window_s: float,
    pieces: int,
) -> float:
    """Exposed seconds of offload traffic at ``PCIE_BYTES_PER_S`` per direction. Copies issued during a
    micro-batch run on the same streams as its DP collectives (FSDP2 copies in on its all-gather stream and
    out on its reduce-scatter stream; DeepSpeed on its reduction stream), so they hide behind that
    micro-batch's compute together with them (``_exposed_s``); only what they add is charged here. Copies
    around the host step, and host-side accumulation (at the node's ``HOST_OPTIMIZER_BYTES_PER_S``), are
    exposed."""
    m = plan.num_microbatches
    copy_s = max(traffic.overlapped_h2d_bytes, traffic.overlapped_d2h_bytes) / m / PCIE_BYTES_PER_S
    overlap = _overlap_fraction(cluster)
    alone_s = _exposed_s(dp_per_mb_s, window_s, pieces, overlap)
    added_s = m * (_exposed_s(dp_per_mb_s + copy_s, window_s, pieces, overlap) - alone_s)
    host_s = traffic.host_accumulate_bytes * gpus_sharing_host(cluster, plan) / HOST_OPTIMIZER_BYTES_PER_S
    return added_s + traffic.step_bytes / PCIE_BYTES_PER_S + host_s


def recomputed_share(model: ModelSpec, plan: ParallelPlan) -> float:
    """Share of blocks a full recompute reruns: all, or ``recompute_layers`` of each model chunk
    (Megatron ``--recompute-method block``)."""
    if plan.recompute_layers is None:
        return 1.0
    return min(1.0, plan.recompute_layers * plan.virtual_stages * plan.pp / model.num_layers)


def step_time(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: ParallelPlan,
    *,
    flash_attention: bool = True,
    tp_backward_overlap: bool | None = None,
    attention_kernel: str | None = None,
) -> TimeBreakdown:
    """Critical-path seconds of one optimizer step, by cause (see the module docstring for conventions; the
    keyword switches describe older software, see ``block_times``)."""
    bt = block_times(
        model,
        cluster,
        plan,
        flash_attention=flash_attention,
        tp_backward_overlap=tp_backward_overlap,
        attention_kernel=attention_kernel,
    )
    block_s = bt.total_s
    # the last pipeline rank runs the head (and with PP=1 the embedding too); the first runs the embedding
    last_tp_s = bt.head_tp_s + (bt.embed_tp_s if plan.pp == 1 else 0.0)
    last_extra_s = bt.head_s + last_tp_s + bt.edge_host_s
    k_last, k_other = pipeline.rank_blocks(model.num_layers, plan, last_extra_s / block_s)
    last_busier = k_last + last_extra_s / block_s >= k_other
    blocks = k_last if last_busier else k_other
    head_s = bt.head_s if last_busier else 0.0
    edge_tp_s = last_tp_s if last_busier else bt.embed_tp_s
    edge_host = bt.edge_host_s if last_busier else 0.0
    m = plan.num_microbatches
    ov = _overlap_fraction(cluster)
    mb_compute_s = blocks * (bt.fwd_s + bt.bwd_s + bt.recompute_s) + head_s
    mb_s = blocks * block_s + head_s + edge_tp_s + edge_host
    busiest = max(k_last, k_other)
    params = _rank_params(model, plan, busiest)
    dp = dp_comm_s(cluster, model, plan, params, busiest)
    dp_mb_s = dp.per_microbatch_s
    # FSDP2's units (block or root), ZeRO-3's parameter-holding modules: what hostops charges per hook
    zero3 = plan.framework is Framework.DEEPSPEED and plan.params_sharded
    units = (
        zero3_gathers(model, plan.tp).modules
        if zero3
        else dp_collective_calls(model, plan, params, busiest)[0]
    )
    # per-micro-batch traffic hides behind each micro-batch's compute, once-per-step traffic behind one's
    dp_exposed = (
        m * _exposed_s(dp_mb_s, mb_compute_s, blocks, ov)
        + _exposed_s(dp.once_s, mb_compute_s, blocks, ov)
        + dp.tail_s
    )
    # the hidden part still holds NCCL's SMs while the compute it overlaps runs (``ncclsm``)
    dp_exposed += ncclsm.hidden_comm_sm_s(cluster, m * dp_mb_s + dp.once_s + dp.tail_s - dp_exposed)
    dp_exposed += fsdpcopy.fsdp_copy_s(cluster, plan, params)  # FSDP2's copy-out / copy-in kernels
    shard = moe.optimizer_shard_params(model, plan, params, busiest)
    offload_s = _offload_s(cluster, plan, host_traffic(plan, shard), dp_mb_s, mb_compute_s, blocks)
    norm_s, norm_calls = tpcomm.sp_norm_grads(model, cluster, plan, blocks, plan.pp == 1 or last_busier)
    tokens = plan.tokens_per_step
    model_flops = flops.model_flops_per_token(model, plan.seq_len) * tokens
    extra = (
        flops.recompute_flops_per_token(model, plan.seq_len, plan.recompute.value)
        * tokens
        * (recomputed_share(model, plan) if plan.recompute is Recompute.FULL else 1.0)
    )
    return TimeBreakdown(
        compute_s=m * (blocks * (bt.fwd_s + bt.bwd_s) + head_s),
        recompute_s=m * blocks * bt.recompute_s,
        tp_comm_s=m * (blocks * bt.tp_s + edge_tp_s) + norm_s,
        cp_comm_s=m * blocks * bt.cp_s,
        pp_p2p_s=pipeline.sends_s(model, cluster, plan),
        overhead_s=(
            cluster.step_overhead_s
            + m * (cluster.microbatch_overhead_s + blocks * bt.host_s + edge_host)
            + norm_calls * cluster.gpu.host.dtensor_collective_overhead_s
            + zero3_host_s(cluster, plan, units, params)
            + fsdp_host_s(cluster, plan, units, params)
        ),
        pp_bubble_s=m
        * mb_s
        * pipeline.shared_core_bubble_fraction(
            pipeline.bubble_fraction(plan.pp, m, plan.virtual_stages),
            cluster.gpus_per_node,
            cluster.cores_per_node,
        ),
        dp_comm_s=dp_exposed,
        optimizer_s=optimizer_s(cluster, plan, shard) + megatron_grad_buffer_s(cluster, plan, params),
        offload_s=offload_s,
        ep_comm_s=m * blocks * bt.ep_s,
        model_flops=model_flops,
        hardware_flops=model_flops + extra,
        dp_comm_total_s=m * dp_mb_s + dp.once_s + dp.tail_s,
    )
