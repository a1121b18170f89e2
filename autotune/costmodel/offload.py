"""The optimizer step and what offload moves between GPU and host: the AdamW step's HBM or host DRAM
traffic, and the host<->GPU bytes each framework's optimizer offload copies per step.

``steptime`` charges these (and re-exports the names here); the figures are per GPU of the busiest rank.
"""

from __future__ import annotations

from typing import NamedTuple

from autotune.costmodel.dpcomm import gathers_per_microbatch
from autotune.costmodel.kernels import HBM_EFFICIENCY
from autotune.plan import Framework, ParallelPlan, StoreDtype
from autotune.specs import ClusterSpec, GPUSpec

__all__ = [
    "OPTIMIZER_BYTES_PER_PARAM",
    "gpu_optimizer_bytes_per_param",
    "TORCH_CPU_ADAMW_BYTES_PER_PARAM",
    "HOST_OPTIMIZER_BYTES_PER_S",
    "PCIE_BYTES_PER_S",
    "host_link_bytes_per_s",
    "HOST_ACCUMULATE_BYTES_PER_PARAM",
    "HostTraffic",
    "host_traffic",
    "gpus_sharing_host",
    "optimizer_s",
]

OPTIMIZER_BYTES_PER_PARAM = 34
"""HBM traffic of a fused mixed-precision AdamW step per parameter: read fp32 grad, master, m, v (16 B), write
master, m, v (12 B) and the 16-bit weight (2 B), plus the grad-norm pass over the fp32 grad (4 B)."""
TORCH_CPU_ADAMW_BYTES_PER_PARAM = 80
"""Host DRAM traffic per parameter of ``torch.optim.AdamW`` on CPU tensors, which Megatron's
``--optimizer-cpu-offload`` runs (megatron/core/optimizer/__init__.py imports ``torch.optim.AdamW as
CPUAdam``; cpu_offloading/hybrid_optimizer.py builds one per parameter with no ``fused``/``foreach``): torch
picks foreach/fused only for CUDA tensors (torch/optim/optimizer.py ``_default_to_fused_or_foreach``), so
the step is ``_single_tensor_adam``'s separate fp32 passes (torch/optim/adam.py): ``param.mul_`` (8 B),
``exp_avg.lerp_`` (12), ``exp_avg_sq.mul_`` (8), ``.addcmul_`` (12), ``sqrt`` (8), ``/`` (8), ``add_``
(8), ``param.addcdiv_`` (16). DeepSpeed's ``DeepSpeedCPUAdam`` (AVX, one fused pass) and FSDP2 with
torchtitan's ``fused`` AdamW (torch's fused CPU kernel) stream ``OPTIMIZER_BYTES_PER_PARAM``."""
HOST_OPTIMIZER_BYTES_PER_S = 100e9
"""Host DRAM bandwidth PER NODE that host-side work streams at (the CPU Adam step, FSDP2's CPU gradient
accumulation); the GPUs of a node share it, so host work is timed over all their shards. A 2-socket server
has 2 x 8 channels x 25.6-38.4 GB/s = 410-614 GB/s theoretical (DDR4-3200 / DDR5-4800) and reaches 150-300
GB/s STREAM; DeepSpeed's CPU-Adam (Ren et al. 2021, ZeRO-Offload Sec. 5.1) is memory-bound at roughly half
of that, and the trials split the cores over the node's ranks (trials/runner.py ``OMP_NUM_THREADS``)."""
PCIE_BYTES_PER_S = 20e9
"""Host<->GPU copy bandwidth per GPU, each direction (PCIe is full duplex; H2D and D2H use separate copy
engines): PCIe 4.0 x16 moves 20-25 GB/s pinned (nvbandwidth / bandwidthTest), 5.0 x16 ~50 GB/s for one GPU
alone. With all GPUs of a node copying at once they share PCIe-switch uplinks and host DRAM (8 GPUs x 2
directions x 20 GB/s = 320 GB/s is already a 2-socket server's STREAM), so 20 GB/s is kept on Gen5 hosts
too."""


def host_link_bytes_per_s(gpu: GPUSpec) -> float:
    """Host<->device copy bandwidth per GPU and direction: the GPU's own figure
    (``GPUSpec.host_link_bytes_per_s``, GB200's NVLink-C2C) or the PCIe one every GPU of a node holds at once
    (``PCIE_BYTES_PER_S``)."""
    return gpu.host_link_bytes_per_s or PCIE_BYTES_PER_S


HOST_ACCUMULATE_BYTES_PER_PARAM = 12
"""Host DRAM traffic of FSDP2's CPU-side gradient accumulation ``grad += new_grad`` on fp32 shards: read 2 x
4 B, write 4 B (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py ``foreach_reduce``)."""


class HostTraffic(NamedTuple):
    """Bytes one GPU moves to/from host memory per optimizer step under offload, by when they move."""

    overlapped_h2d_bytes: float
    """Host-to-device copies issued during the micro-batches (spread evenly), able to hide behind compute."""
    overlapped_d2h_bytes: float
    """Device-to-host copies issued during the micro-batches."""
    step_bytes: float
    """Copies outside the compute (gradients down before, parameters up after the host step), both ways."""
    host_accumulate_bytes: float
    """Host DRAM traffic of gradient accumulation done by the CPU (FSDP2), on the critical path."""


def host_traffic(plan: ParallelPlan, shard_params: float) -> HostTraffic:
    """Host<->GPU bytes per step of one GPU under offload (none without), for ``shard_params`` parameters in
    its optimizer shard, as each framework moves them with the configs autotune emits:

    - FSDP2 ``CPUOffloadPolicy`` (PR pytorch#120256; ``_fsdp_param.py`` ``all_gather_inputs``,
      ``_fsdp_collectives.py`` ``foreach_reduce``): every all-gather first copies the fp32 sharded parameter
      to the GPU (4 B, cast to bf16 there), every reduce-scatter output (fp32, 4 B) goes to the host; from the
      second micro-batch on the CPU adds it into the host gradient (blocking copy, ``+=`` on the host).
    - DeepSpeed ``offload_optimizer`` (ZeRO-1/2 stage_1_and_2.py, ZeRO-3 stage3.py; no ``offload_param``):
      with accumulation every micro-batch moves the 16-bit gradient partition to a pinned host buffer and,
      from the second on, brings it back to add the new one on the GPU
      (``async_accumulate_grad_in_cpu_via_gpu``, ``partition_grads``; ZeRO-1 reduces, and so does this,
      only at the boundary); at the boundary the fp32 partition goes down (4 B), after the step the 16-bit
      partition comes up (2 B).
    - Megatron ``--optimizer-cpu-offload`` (HybridDeviceOptimizer): the fp32 ``main_grad`` shard goes down
      (4 B) and the updated 16-bit shard comes up (2 B, cast on the host) once per step.
    """
    if not plan.offload:
        return HostTraffic(0.0, 0.0, 0.0, 0.0)
    m = plan.num_microbatches
    if plan.framework is Framework.FSDP:
        return HostTraffic(
            overlapped_h2d_bytes=m * gathers_per_microbatch(plan) * 4 * shard_params,
            overlapped_d2h_bytes=m * 4 * shard_params,
            step_bytes=0.0,
            host_accumulate_bytes=(m - 1) * HOST_ACCUMULATE_BYTES_PER_PARAM * shard_params,
        )
    step = (4 + 2) * shard_params
    if plan.framework is Framework.MEGATRON or m == 1:
        return HostTraffic(0.0, 0.0, step, 0.0)
    if plan.zero_stage == 1:
        return HostTraffic(0.0, 0.0, step + (2 + 2) * shard_params, 0.0)
    return HostTraffic(
        overlapped_h2d_bytes=(m - 1) * 2 * shard_params,
        overlapped_d2h_bytes=m * 2 * shard_params,
        step_bytes=step,
        host_accumulate_bytes=0.0,
    )


def gpu_optimizer_bytes_per_param(plan: ParallelPlan) -> float:
    """``OPTIMIZER_BYTES_PER_PARAM``, or for a framework fsdp plan that stores its weights or moments in bf16
    (``plan.weight_dtype``, ``plan.moment_dtype``) the same passes over what it stores: read the gradient,
    weight and both moments, write weight and moments, the grad-norm pass over the gradient (16 B all bf16,
    24 with fp32 moments beside bf16 weights)."""
    weight, moment = (4.0 if d is StoreDtype.FP32 else 2.0 for d in (plan.weight_dtype, plan.moment_dtype))
    if weight == moment == 4.0:
        return float(OPTIMIZER_BYTES_PER_PARAM)
    return 4 * weight + 4 * moment


def gpus_sharing_host(cluster: ClusterSpec, plan: ParallelPlan) -> int:
    return min(cluster.gpus_per_node, plan.world_size)


def optimizer_s(cluster: ClusterSpec, plan: ParallelPlan, shard_params: float) -> float:
    """Optimizer step seconds. On GPU the AdamW step streams ``OPTIMIZER_BYTES_PER_PARAM`` per parameter of
    this rank's optimizer shard through HBM. With offload (ZeRO-Offload, Ren et al. 2021) the step runs on the
    host over the shards of all GPUs of a node at the node's ``HOST_OPTIMIZER_BYTES_PER_S`` (Megatron's torch
    CPU AdamW: ``TORCH_CPU_ADAMW_BYTES_PER_PARAM``)."""
    if not plan.offload:
        hbm = cluster.gpu.memory_bandwidth_bytes_per_s * HBM_EFFICIENCY
        return shard_params * gpu_optimizer_bytes_per_param(plan) / hbm
    node_params = shard_params * gpus_sharing_host(cluster, plan)
    per_param = (
        TORCH_CPU_ADAMW_BYTES_PER_PARAM if plan.framework is Framework.MEGATRON else OPTIMIZER_BYTES_PER_PARAM
    )
    return node_params * per_param / HOST_OPTIMIZER_BYTES_PER_S
