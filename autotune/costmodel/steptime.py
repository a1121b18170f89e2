"""Time of one optimizer step on the critical path: the busiest pipeline rank of one replica.

Convention: per-GPU work is that of the most-loaded pipeline rank (``pipeline.stage_split``); collectives are
timed by ``comm`` on the links ``comm.group_link`` assigns from the rank order ``pp, dp, cp, tp`` (outer to
inner: TP stride 1, CP stride ``tp``, DP stride ``tp*cp``, PP stride ``tp*cp*dp``). Every term is one small
function citing its source; the overhead constants below are the only knobs besides the per-GPU
``gemm_efficiency`` in ``data/hardware.yaml``, and none is per model or per run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple

from autotune.costmodel import comm, flops, pipeline
from autotune.plan import Framework, ParallelPlan, Recompute, Sharding
from autotune.specs import ClusterSpec, ModelSpec

__all__ = ["TimeBreakdown", "BlockTimes", "block_times", "step_time"]

ACT_BYTES = 2
"""Bytes per activation element sent by TP/CP/PP collectives (bf16/fp16; fp8 recipes keep them 16-bit)."""
PARAM_GATHER_BYTES = 2
"""Bytes per parameter of ZeRO/FSDP all-gathers (16-bit compute weights)."""
GRAD_REDUCE_BYTES = {"megatron": 4, "fsdp": 4, "deepspeed": 2}
"""Bytes per gradient element reduced over DP: Megatron reduces its fp32 ``main_grad`` buffer; torchtitan's
FSDP2 policy uses ``reduce_dtype=float32``; DeepSpeed's ``communication_data_type`` defaults to the 16-bit
model dtype."""
DP_OVERLAP_FRACTION = 0.8
"""Share of the overlappable compute window during which DP/ZeRO/FSDP collectives run hidden. Below 1 because
NCCL kernels take SMs and HBM bandwidth from the GEMMs they hide behind (PyTorch DDP paper, Li et al. 2020,
Sec. 5: overlap recovers most but not all communication time). The first gather / last reduce of a window is
always exposed (see ``_exposed_s``)."""
OPTIMIZER_BYTES_PER_PARAM = 34
"""HBM traffic of a fused mixed-precision AdamW step per parameter: read fp32 grad, master, m, v (16 B), write
master, m, v (12 B) and the 16-bit weight (2 B), plus the grad-norm pass over the fp32 grad (4 B)."""
ELEMENTWISE_BWD_FACTOR = 1.5
"""Backward/forward HBM traffic of elementwise kernels: the backward of ``y = f(x)`` reads ``x`` (or ``y``)
and ``dy`` and writes ``dx`` (3 tensors) where the forward read 1 and wrote 1."""
FLASH_BWD_SLOWDOWN = {"h100-sxm": 1.6, "h100-pcie": 1.6, "h200": 1.6}
"""How much slower per FLOP a FlashAttention-2 backward runs than its forward, by GPU (default
``FLASH_BWD_SLOWDOWN_DEFAULT``). Measured on an H200 through torch SDPA (causal, head dim 128, 4k-8k tokens):
forward 555-601 TFLOP/s, backward 333-391, i.e. 1.5-1.7x. FA2 paper (Dao 2023, Sec. 4.1) on A100: forward up
to 73% of peak, backward up to 63%, i.e. ~1.2x. Pre-FlashAttention kernels (batched GEMMs) have no
slowdown."""
FLASH_BWD_SLOWDOWN_DEFAULT = 1.2
HBM_EFFICIENCY = 0.8
"""Fraction of the HBM peak a streaming kernel reaches: a device-to-device copy moved 4.14 of 4.8 TB/s on an
H200 (0.86, measured with torch); STREAM-like kernels reach ~0.8 on A100 (benchmarks/gpu_gemm.py measures
it)."""
HOST_OPTIMIZER_BYTES_PER_S = 100e9
"""Host DRAM bandwidth per node the CPU Adam step streams at: a 2-socket server reaches 150-300 GB/s STREAM;
DeepSpeed's CPU-Adam (Ren et al. 2021, ZeRO-Offload Sec. 5.1) is memory-bound at roughly half of it."""
PCIE_BYTES_PER_S = 20e9
"""Host<->GPU copy bandwidth per GPU, each direction: PCIe 4.0 x16 moves 20-25 GB/s in practice (nvbandwidth /
bandwidthTest); Gen5 hosts do better, so offload is conservative there."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TimeBreakdown:
    """Seconds per optimizer step on the critical path, by cause. ``step_time_s`` is their sum."""

    compute_s: float
    """Forward + backward GEMMs and attention of all micro-batches on one stage (no recompute)."""
    recompute_s: float
    """Extra forward work of activation recomputation."""
    tp_comm_s: float
    """Exposed TP all-reduce / all-gather + reduce-scatter (with SP)."""
    cp_comm_s: float
    """Exposed context-parallel K/V exchange."""
    pp_p2p_s: float
    """Pipeline point-to-point activation/gradient sends on the critical path."""
    pp_bubble_s: float
    """Pipeline fill/drain idle time."""
    dp_comm_s: float
    """Exposed (not overlapped with backward) DP all-reduce / ZeRO/FSDP gathers and reduce-scatters."""
    optimizer_s: float
    """Optimizer step (memory-bound) on GPU or host."""
    offload_s: float
    """Exposed host<->device traffic of optimizer offload."""
    model_flops: float
    """Model FLOPs per step over all GPUs (6N-style + attention, no recompute): the MFU numerator."""
    hardware_flops: float
    """FLOPs actually executed per step over all GPUs (with recompute): the HFU numerator."""
    dp_comm_total_s: float = 0.0
    """DP communication including the part hidden behind backward (for reports)."""

    @property
    def step_time_s(self) -> float:
        return (self.compute_s + self.recompute_s + self.tp_comm_s + self.cp_comm_s + self.pp_p2p_s
                + self.pp_bubble_s + self.dp_comm_s + self.optimizer_s + self.offload_s)

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
        return self.fwd_s + self.bwd_s + self.recompute_s + self.tp_s + self.cp_s


def _rates(cluster: ClusterSpec, precision: str) -> tuple[float, float, float]:
    """(GEMM FLOP/s, attention FLOP/s, HBM bytes/s) actually reached: peak x ``gemm_efficiency`` and HBM peak
    x ``HBM_EFFICIENCY``. fp8 recipes run the attention core in bf16 (Transformer Engine); a GPU without the
    format falls back to its 16-bit peak (``check_plan`` reports the plan as illegal)."""
    gpu = cluster.gpu
    half = gpu.bf16_flops or gpu.fp16_flops or gpu.fp32_flops or 1.0
    gemm = gpu.peak_flops(precision) or half
    attn = half if precision == "fp8" else gemm
    eff = gpu.gemm_efficiency
    return gemm * eff, attn * eff, gpu.memory_bandwidth_bytes_per_s * HBM_EFFICIENCY


def _cp_exposed_s(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, tokens: float,
                  attn_fwd_s: float) -> float:
    """Ring attention (Liu et al. 2023; Megatron-Core CP): each of ``cp-1`` steps passes this rank's K and V
    chunk (``2 x tokens x kv_hidden/tp``) to the next CP rank; backward passes K, V and their gradients (2x).
    Each transfer overlaps the attention of the chunk already held, so only what exceeds the attention time
    of the pass is exposed."""
    if plan.cp <= 1:
        return 0.0
    link = comm.group_link(cluster, plan.cp, plan.tp)
    step_bytes = 2 * tokens * model.kv_hidden_size / plan.tp * ACT_BYTES
    fwd = (plan.cp - 1) * comm.p2p_s(step_bytes, link)
    return max(0.0, fwd - attn_fwd_s) + max(0.0, 2 * fwd - 2 * attn_fwd_s)


def _tp_exposed_s(one_s: float, plan: ParallelPlan, wgrad_s: float, overlap: bool) -> float:
    """TP collectives of one block (Shoeybi et al. 2019 Sec. 3; Korthikanti et al. 2022 Sec. 4.2.2): 2
    all-reduces of ``b s h`` in forward and 2 in backward, or with sequence parallelism 2 all-gathers + 2
    reduce-scatters (same ring time); a fully recomputed forward repeats its 2. Forward ones sit between
    dependent GEMMs and are exposed. With ``overlap`` the backward ones run under the weight-gradient GEMMs
    (Megatron-LM's async TP all-reduce, since commit 16c90445e7, 2021-09), up to ``DP_OVERLAP_FRACTION`` of
    them."""
    fwd = (4 if plan.recompute is Recompute.FULL else 2) * one_s
    if overlap:
        return fwd + max(0.0, 2 * one_s - DP_OVERLAP_FRACTION * wgrad_s)
    return fwd + 2 * one_s


def block_times(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, *, flash_attention: bool = True,
                tp_backward_overlap: bool | None = None) -> BlockTimes:
    """Per-block, per-micro-batch times on one GPU: ``FLOPs / (peak x gemm_efficiency)`` for GEMMs and
    attention, ``bytes / (HBM x HBM_EFFICIENCY)`` for the elementwise kernels (``flops`` module); the sequence
    is split over CP, weights over TP. Software switches (defaults: today's frameworks):
    ``flash_attention=False`` models pre-2022 kernels that materialise the ``s x s`` scores (no causal
    skipping, ``flops.SCORE_BYTES`` of traffic per score); ``tp_backward_overlap`` (default: Megatron only)
    hides backward TP collectives under GEMMs."""
    gemm_rate, attn_rate, hbm_rate = _rates(cluster, str(plan.precision))
    tp, s = plan.tp, plan.seq_len
    tokens = plan.micro_batch * s / plan.cp
    causal = flops.CAUSAL_ATTENTION_FRACTION if flash_attention else 1.0
    gemm_s = tokens * flops.layer_gemm_flops_per_token(model) / tp / gemm_rate
    attn_s = tokens * flops.attention_flops_per_token(model, s, causal_fraction=causal) / tp / attn_rate
    ew_bytes = flops.elementwise_bytes_per_token(model, tp=tp, sequence_parallel=plan.sequence_parallel)
    score_s = 0.0 if flash_attention else tokens * flops.score_bytes_per_token(model, s, tp=tp) / hbm_rate
    ew_s = tokens * ew_bytes / hbm_rate + score_s
    recompute = plan.recompute
    recompute_s = (gemm_s + attn_s + ew_s if recompute is Recompute.FULL
                   else attn_s + score_s if recompute is Recompute.SELECTIVE else 0.0)
    tp_s = 0.0
    if tp > 1:
        one = comm.allreduce_s(tokens * model.hidden_size * ACT_BYTES, tp, comm.group_link(cluster, tp, 1))
        overlap = plan.framework is Framework.MEGATRON if tp_backward_overlap is None else tp_backward_overlap
        tp_s = _tp_exposed_s(one, plan, gemm_s, overlap)
    head_s = tokens * (3 * flops.lm_head_flops_per_token(model) / gemm_rate
                       + flops.LOGITS_BYTES_PER_VOCAB * model.vocab_size / hbm_rate) / tp
    cp_s = _cp_exposed_s(model, cluster, plan, tokens, attn_s)
    slowdown = FLASH_BWD_SLOWDOWN.get(cluster.gpu.key, FLASH_BWD_SLOWDOWN_DEFAULT) if flash_attention else 1.0
    return BlockTimes(gemm_s, attn_s, 2 * slowdown * attn_s, ew_s, recompute_s, tp_s, cp_s, head_s)


def _exposed_s(comm_s: float, window_s: float, pieces: int) -> float:
    """Communication left on the critical path when it may hide behind ``window_s`` of compute: at least one
    piece (the first gather / last reduce-scatter bucket of the window has nothing to overlap), else what
    ``DP_OVERLAP_FRACTION`` of the window cannot cover."""
    return max(comm_s / max(1, pieces), comm_s - DP_OVERLAP_FRACTION * window_s)


def _rank_params(model: ModelSpec, plan: ParallelPlan, blocks: int) -> float:
    """Parameters held by the most-loaded GPU: its blocks split over TP, plus the embedding / LM head
    (vocab-parallel) on a pipeline end; with PP=1 the whole model."""
    if plan.pp == 1:
        return model.num_params / plan.tp
    return (blocks * model.params_per_layer + model.vocab_size * model.hidden_size) / plan.tp


def _dp_comm_s(cluster: ClusterSpec, plan: ParallelPlan, params: float, blocks: int,
               mb_compute_s: float) -> tuple[float, float]:
    """(exposed, total) DP/ZeRO/FSDP communication per step (Rajbhandari et al. 2020 Sec. 7; Zhao et al. 2023,
    FSDP Sec. 3). The group is ``dp x cp`` ranks at stride ``tp`` (CP ranks hold the same weights).

    none: all-reduce grads once per step. zero1: reduce-scatter grads + all-gather 16-bit params once per step
    (Megatron distributed optimizer; DeepSpeed stage 1 with ``reduce_scatter: true``). zero2: DeepSpeed
    reduces gradients in every micro-batch's backward, gathers params once. zero3 / fsdp-full / hsdp: every
    micro-batch all-gathers params for forward and again for backward and reduce-scatters grads; fsdp-grad-op
    keeps the forward gather for backward. hsdp shards inside groups of ``hsdp_shard_size`` and all-reduces
    the shard across replicas once per step. Once-per-step traffic hides behind one micro-batch's compute,
    per-micro-batch traffic behind each micro-batch's.
    """
    n = plan.dp * plan.cp
    if n <= 1:
        return 0.0, 0.0
    shard = plan.shard_degree * plan.cp
    link = comm.group_link(cluster, shard, plan.tp)
    grad_bytes = params * GRAD_REDUCE_BYTES[plan.framework.value]
    param_bytes = params * PARAM_GATHER_BYTES
    sharding = plan.sharding
    m = plan.num_microbatches
    per_mb = once = 0.0
    if sharding is Sharding.NONE:
        once = comm.allreduce_s(grad_bytes, n, link)
    elif sharding is Sharding.ZERO1:
        once = comm.reduce_scatter_s(grad_bytes, n, link) + comm.allgather_s(param_bytes, n, link)
    elif sharding is Sharding.ZERO2:
        per_mb = comm.reduce_scatter_s(grad_bytes, n, link)
        once = comm.allgather_s(param_bytes, n, link)
    else:
        gathers = 1 if sharding is Sharding.FSDP_GRAD_OP else 2
        per_mb = (gathers * comm.allgather_s(param_bytes, shard, link)
                  + comm.reduce_scatter_s(grad_bytes, shard, link))
        if sharding is Sharding.HSDP:
            replicas = n // shard
            rep_link = comm.group_link(cluster, replicas, plan.tp * shard)
            once = comm.allreduce_s(grad_bytes / shard, replicas, rep_link)
    exposed = m * _exposed_s(per_mb, mb_compute_s, blocks) + _exposed_s(once, mb_compute_s, blocks)
    return exposed, m * per_mb + once


def _optimizer_s(cluster: ClusterSpec, plan: ParallelPlan, params: float) -> tuple[float, float]:
    """(step, offload traffic) seconds. On GPU the AdamW step streams ``OPTIMIZER_BYTES_PER_PARAM`` per
    parameter of this rank's optimizer shard through HBM. With offload (ZeRO-Offload, Ren et al. 2021) the
    step runs on the host over the shards of all GPUs of a node at ``HOST_OPTIMIZER_BYTES_PER_S``, and each
    GPU copies its 16-bit gradient shard down and its 16-bit parameter shard up over PCIe (kept exposed:
    conservative)."""
    shard = params / (plan.shard_degree * plan.cp) if plan.zero_stage >= 1 else params
    if not plan.offload:
        hbm = cluster.gpu.memory_bandwidth_bytes_per_s * HBM_EFFICIENCY
        return shard * OPTIMIZER_BYTES_PER_PARAM / hbm, 0.0
    host_s = shard * cluster.gpus_per_node * OPTIMIZER_BYTES_PER_PARAM / HOST_OPTIMIZER_BYTES_PER_S
    return host_s, shard * (2 + PARAM_GATHER_BYTES) / PCIE_BYTES_PER_S


def _pp_p2p_s(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan) -> float:
    """Activation sends of the busiest pipeline rank per step: per micro-batch one forward and one backward
    send of ``b s h`` per model chunk (``2v``), blocking in Megatron's and torch's schedules. With TP each
    rank sends its ``1/tp`` slice (Narayanan et al. 2021 Sec. 4.1 scatter/gather; inherent with sequence
    parallelism)."""
    if plan.pp <= 1:
        return 0.0
    link = comm.group_link(cluster, plan.pp, plan.tp * plan.cp * plan.dp)
    nbytes = plan.micro_batch * plan.seq_len / plan.cp * model.hidden_size * ACT_BYTES / plan.tp
    return plan.num_microbatches * 2 * plan.virtual_stages * comm.p2p_s(nbytes, link)


def step_time(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, *, flash_attention: bool = True,
              tp_backward_overlap: bool | None = None) -> TimeBreakdown:
    """Critical-path seconds of one optimizer step, by cause (see the module docstring for conventions; the
    keyword switches describe older software, see ``block_times``)."""
    bt = block_times(model, cluster, plan, flash_attention=flash_attention,
                     tp_backward_overlap=tp_backward_overlap)
    block_s = bt.total_s
    k_last, k_other = pipeline.stage_split(model.num_layers, plan.pp, bt.head_s / block_s)
    last_busier = k_last + bt.head_s / block_s >= k_other
    blocks = k_last if last_busier else k_other
    head_s = bt.head_s if last_busier else 0.0
    m = plan.num_microbatches
    mb_compute_s = blocks * (bt.fwd_s + bt.bwd_s + bt.recompute_s) + head_s
    mb_s = blocks * block_s + head_s
    params = _rank_params(model, plan, max(k_last, k_other))
    dp_exposed, dp_total = _dp_comm_s(cluster, plan, params, blocks, mb_compute_s)
    opt_s, offload_s = _optimizer_s(cluster, plan, params)
    tokens = plan.tokens_per_step
    model_flops = flops.model_flops_per_token(model, plan.seq_len) * tokens
    extra = flops.recompute_flops_per_token(model, plan.seq_len, plan.recompute.value) * tokens
    return TimeBreakdown(
        compute_s=m * (blocks * (bt.fwd_s + bt.bwd_s) + head_s),
        recompute_s=m * blocks * bt.recompute_s,
        tp_comm_s=m * blocks * bt.tp_s,
        cp_comm_s=m * blocks * bt.cp_s,
        pp_p2p_s=_pp_p2p_s(model, cluster, plan),
        pp_bubble_s=pipeline.bubble_fraction(plan.pp, m, plan.virtual_stages) * m * mb_s,
        dp_comm_s=dp_exposed, optimizer_s=opt_s, offload_s=offload_s,
        model_flops=model_flops, hardware_flops=model_flops + extra, dp_comm_total_s=dp_total,
    )
