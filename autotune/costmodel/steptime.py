"""Time of one optimizer step on the critical path: the busiest pipeline rank of one replica.

Convention: per-GPU work is that of the most-loaded pipeline rank (``pipeline.rank_blocks``); collectives are
timed by ``comm`` on the links ``comm.group_link`` assigns from the rank order ``pp, dp, cp, tp`` (outer to
inner: TP stride 1, CP stride ``tp``, DP stride ``tp*cp``, PP stride ``tp*cp*dp``). Every term is one small
function citing its source (one block's in ``blocktime``); the overhead constants in ``overlap``,
``blocktime`` and ``offload`` are the only knobs besides the per-GPU ``gemm_efficiency`` in
``data/hardware.yaml``, and none is per model or per run. A probe profile or a calibration
(``autotune.calibrate``) changes the calibratable ones as data, never as module globals:
``GPUSpec.gemm_efficiency``, ``ClusterSpec.collective_efficiency``, ``dp_overlap_fraction``,
``step_overhead_s`` and ``microbatch_overhead_s``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from autotune.costmodel import flops, fsdpcopy, moe, mtp, ncclsm, pipeline, tpcomm
from autotune.costmodel.blocktime import BlockTimes, block_times, recomputed_share
from autotune.costmodel.dpcomm import collective_calls as dp_collective_calls
from autotune.costmodel.dpcomm import dp_comm_s, zero3_gathers
from autotune.costmodel.gradbuffer import megatron_grad_buffer_s
from autotune.costmodel.hostops import fsdp_host_s, zero3_host_s
from autotune.costmodel.kernels import HBM_EFFICIENCY
from autotune.costmodel.offload import (
    HOST_ACCUMULATE_BYTES_PER_PARAM,
    HOST_OPTIMIZER_BYTES_PER_S,
    OPTIMIZER_BYTES_PER_PARAM,
    PCIE_BYTES_PER_S,
    TORCH_CPU_ADAMW_BYTES_PER_PARAM,
    HostTraffic,
    gpus_sharing_host,
    host_link_bytes_per_s,
    host_traffic,
    optimizer_s,
)
from autotune.costmodel.overlap import dp_overlap_fraction, exposed_s
from autotune.costmodel.states import layer_params_per_gpu, vocab_split
from autotune.pickled import by_values
from autotune.plan import Framework, ParallelPlan, Recompute
from autotune.specs import ClusterSpec, ModelSpec

__all__ = [
    "TimeBreakdown",
    "HostTraffic",
    "host_traffic",
    "step_time",
    "OPTIMIZER_BYTES_PER_PARAM",
    "TORCH_CPU_ADAMW_BYTES_PER_PARAM",
    "HOST_OPTIMIZER_BYTES_PER_S",
    "PCIE_BYTES_PER_S",
    "HOST_ACCUMULATE_BYTES_PER_PARAM",
    "HBM_EFFICIENCY",
]


@by_values
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


def _rerun_s(bt: BlockTimes, plan: ParallelPlan) -> float:
    """Recompute a block runs twice under the zero-bubble schedule: torch's pipelining takes the input and
    the weight gradients in two autograd passes (``stage_backward_input``, ``stage_backward_weight``), and a
    non-reentrant checkpoint (torchtitan's AC) re-runs its forward in each (seen on CPU: three forward calls
    per micro-batch with full AC, two with 1F1B; docs/pipeline_schedules.md)."""
    return bt.recompute_s if plan.schedule.zero_bubble else 0.0


def _bubble_fraction(bt: BlockTimes, plan: ParallelPlan) -> float:
    """The schedule's bubble (``pipeline``). Zero-bubble schedules split a block's work into its forward,
    its input gradient and its deferred weight gradient: the weight-gradient GEMMs, as many FLOPs as the
    forward GEMMs (Qi et al. 2024 Sec. 2: ``W`` of a linear layer equals ``F``), and their own recompute
    (``_rerun_s``); the attention core's backward and the first recompute are on the input-gradient side."""
    m, v = plan.num_microbatches, plan.virtual_stages
    if not plan.schedule.zero_bubble:
        return pipeline.bubble_fraction(plan.pp, m, v)
    work = bt.fwd_s + bt.bwd_s + 2 * bt.recompute_s
    forward, weight = (bt.fwd_s / work, (bt.gemm_s + bt.recompute_s) / work) if work > 0 else (1.0, 0.0)
    if plan.schedule.v_shape:
        return pipeline.zbv_bubble_fraction(plan.pp, m, forward, weight)
    return pipeline.bubble_fraction(plan.pp, m, v, weight)


def _rank_params(model: ModelSpec, plan: ParallelPlan, blocks: int) -> float:
    """Parameters held by the most-loaded GPU: its blocks (``states.layer_params_per_gpu``), plus the
    embedding / LM head on a pipeline end (split as ``states.vocab_split``); with PP=1 the whole model."""
    both = plan.pp == 1 or plan.schedule.v_shape  # a V holds the embedding and the head on rank 0
    ends = model.embedding_params if both else model.vocab_size * model.hidden_size
    n = model.num_layers if plan.pp == 1 else blocks
    rest = model.num_params - model.embedding_params - n * model.params_per_layer if plan.pp == 1 else 0.0
    return n * layer_params_per_gpu(model, plan) + rest / plan.tp + ends / vocab_split(plan)


def _offload_s(
    cluster: ClusterSpec,
    plan: ParallelPlan,
    traffic: HostTraffic,
    dp_per_mb_s: float,
    window_s: float,
    pieces: int,
) -> float:
    """Exposed seconds of offload traffic at the host link's bandwidth per direction
    (``host_link_bytes_per_s``). Copies issued during a micro-batch run on the same streams as its DP
    collectives (FSDP2 copies in on its all-gather stream and out on its reduce-scatter stream; DeepSpeed on
    its reduction stream), so they hide behind that micro-batch's compute together with them
    (``overlap.exposed_s``); only what they add is charged here. Copies around the host step, and host-side
    accumulation (at the node's ``HOST_OPTIMIZER_BYTES_PER_S``), are exposed."""
    m = plan.num_microbatches
    link = host_link_bytes_per_s(cluster.gpu)
    copy_s = max(traffic.overlapped_h2d_bytes, traffic.overlapped_d2h_bytes) / m / link
    overlap = dp_overlap_fraction(cluster)
    alone_s = exposed_s(dp_per_mb_s, window_s, pieces, overlap)
    added_s = m * (exposed_s(dp_per_mb_s + copy_s, window_s, pieces, overlap) - alone_s)
    host_s = traffic.host_accumulate_bytes * gpus_sharing_host(cluster, plan) / HOST_OPTIMIZER_BYTES_PER_S
    return added_s + traffic.step_bytes / link + host_s


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
    # the last pipeline rank runs the head (and with PP=1 or a V the embedding too); the first the embedding
    ends_together = plan.pp == 1 or plan.schedule.v_shape
    last_tp_s = bt.head_tp_s + (bt.embed_tp_s if ends_together else 0.0)
    mtp_s = mtp.modules_s(model, cluster, plan, bt)  # multi-token prediction, on the last rank
    last_extra_s = bt.head_s + mtp_s + last_tp_s + bt.edge_host_s
    k_last, k_other = pipeline.rank_blocks(
        model.num_layers, plan, last_extra_s / block_s, mtp=model.mtp_layers
    )
    last_busier = k_last + last_extra_s / block_s >= k_other
    blocks = k_last if last_busier else k_other
    head_s = bt.head_s + mtp_s if last_busier else 0.0
    edge_tp_s = last_tp_s if last_busier else (0.0 if ends_together else bt.embed_tp_s)
    edge_host = bt.edge_host_s if last_busier else 0.0
    m = plan.num_microbatches
    ov = dp_overlap_fraction(cluster)
    rerun_s = _rerun_s(bt, plan)
    # what DP traffic hides behind: the device's work and what its compute stream idles through, the MoE host
    # sync (``moehost``) and the activation copies it waits for (``actoffload``)
    idle_s = bt.moe_sync_s + bt.offload_s
    mb_compute_s = blocks * (bt.fwd_s + bt.bwd_s + bt.recompute_s + rerun_s + idle_s) + head_s
    mb_s = blocks * (block_s + rerun_s) + head_s + edge_tp_s + edge_host
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
    # per-micro-batch traffic hides behind each micro-batch's compute; once-per-step traffic behind one
    # micro-batch's, beside that micro-batch's own traffic (one window, not two)
    dp_exposed = (
        (m - 1) * exposed_s(dp_mb_s, mb_compute_s, blocks, ov)
        + exposed_s(dp_mb_s + dp.once_s, mb_compute_s, blocks, ov)
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
        * (2 if plan.schedule.zero_bubble else 1)  # ``_rerun_s``
    )
    return TimeBreakdown(
        compute_s=m * (blocks * (bt.fwd_s + bt.bwd_s) + head_s),
        recompute_s=m * blocks * (bt.recompute_s + rerun_s),
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
            _bubble_fraction(bt, plan),
            cluster.gpus_per_node,
            cluster.cores_per_node,
        ),
        dp_comm_s=dp_exposed,
        optimizer_s=optimizer_s(cluster, plan, shard) + megatron_grad_buffer_s(cluster, plan, params),
        offload_s=offload_s + m * blocks * bt.offload_s,
        ep_comm_s=m * blocks * bt.ep_s,
        model_flops=model_flops,
        hardware_flops=model_flops + extra,
        dp_comm_total_s=m * dp_mb_s + dp.once_s + dp.tail_s,
    )
