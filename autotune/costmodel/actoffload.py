"""Megatron's fine-grained activation offloading (``--fine-grained-activation-offloading --offload-modules``,
``plan.offload_modules``): what the listed modules save for backward goes to host memory in forward and comes
back before their backward.

Megatron-Core (``transformer_config.py`` ``offload_modules``; docs/user-guide/features/
fine_grained_activation_offloading.md) wraps each listed module's forward in an offload group: the tensors it
saves for backward (at least ``min_offloaded_tensor_size``, 1M elements) are copied device-to-host on a side
stream while the forward goes on, and copied back on another stream ahead of the module's backward. Priced
here (``OFFLOAD_MODULES``), per token of one micro-batch on one rank and the mean over the model's blocks, in
the convention of ``activations.tp_split_bytes``:

- ``expert_fc1``: the permuted expert input the first grouped GEMM saves for its weight gradient, one
  ``h``-wide tensor per routed copy (its fp8 copy under fp8: ``activations`` counts it the same way);
- ``moe_act``: the activation's input, the FC1 output, two expert-ffn-wide halves per routed copy for a gated
  MLP (one otherwise), 16-bit (the activation reads it in the compute dtype).

Memory: every offloaded layer leaves the device but the group in use: the manager keeps the last groups of a
forward on the device (the "last-group margin used to avoid backward reload stalls") and reloads one layer
ahead of the backward, so ``RESIDENT_LAYERS`` layers' worth stay; host memory holds the rest of every
micro-batch in flight.

Time: the copies run on their own streams at the host link's bandwidth (``host_link_bytes_per_s``); per block
the forward's device-to-host copy hides behind the block's forward and the host-to-device copy behind its
backward, and only what passes them is exposed (the docs' trade-off: "memory savings and PCIe bandwidth
overhead"). Layer-level offload (``plan.offload_activation_layers``, Transformer Engine's
``AsyncDoubleBufferGroupOffloadHandler``: a layer's saved tensors go out while the next layer computes and
come back one layer ahead in backward) is timed the same way, each offloaded layer moving all it stores.
"""

from __future__ import annotations

from autotune.costmodel.activations import Kernels, LayerShape, kernels_for, layer_activation_bytes
from autotune.costmodel.moe import busiest_load
from autotune.costmodel.offload import host_link_bytes_per_s
from autotune.modelshape import routed_width_per_layer
from autotune.plan import ParallelPlan
from autotune.specs import ClusterSpec, GPUSpec, ModelSpec

__all__ = ["RESIDENT_LAYERS", "offloaded_bytes_per_layer", "exposed_s", "block_exposed_s"]

RESIDENT_LAYERS = 2
"""Layers of offloaded tensors on the device at the backward's peak: the layer whose backward runs and the
one reloaded ahead of it (the forward's last group is never sent)."""


def offloaded_bytes_per_layer(model: ModelSpec, plan: ParallelPlan, *, e: int, k: Kernels) -> float:
    """Bytes of one (mean) block and micro-batch on one rank that ``plan.offload_modules`` moves to the host
    (module docstring); 0 without modules or MoE layers."""
    mods = set(plan.offload_modules)
    if not mods or not model.is_moe:
        return 0.0
    tokens = plan.seq_len / plan.cp * plan.micro_batch
    load = busiest_load(plan)
    width = 0.0
    if "expert_fc1" in mods:
        width += k.routed_saved_h * routed_width_per_layer(model) * load * (1 if k.fp8_gemm_inputs else e)
    if "moe_act" in mods:
        copies = len(model.moe_layers) / model.num_layers * model.experts_per_token * load
        width += copies * model.expert_ffn_hidden_size * (2 if model.gated_mlp else 1) * e
    return tokens * width / plan.tp


def exposed_s(nbytes: float, gpu: GPUSpec, fwd_device_s: float, bwd_device_s: float) -> tuple[float, float]:
    """(forward, backward) seconds of one block's offload copies (``nbytes`` each way) that its forward and
    backward device time do not hide (module docstring)."""
    if not nbytes:
        return 0.0, 0.0
    copy_s = nbytes / host_link_bytes_per_s(gpu)
    return max(0.0, copy_s - fwd_device_s), max(0.0, copy_s - bwd_device_s)


def block_exposed_s(
    model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, fwd_device_s: float, bwd_device_s: float
) -> tuple[float, float]:
    """(forward, backward) exposed copy seconds of one (mean) block and micro-batch: its fine-grained
    offload, and its share of the layer-level offload's whole layers (module docstring)."""
    e, k = cluster.gpu.half_bytes, kernels_for(plan)
    fwd, bwd = exposed_s(
        offloaded_bytes_per_layer(model, plan, e=e, k=k), cluster.gpu, fwd_device_s, bwd_device_s
    )
    n = plan.offload_activation_layers
    if n:
        x, rc = LayerShape.of(model, plan), plan.recompute
        whole = layer_activation_bytes(x, tp=plan.tp, sp=plan.sequence_parallel, recompute=rc, e=e, k=k)
        share = min(1.0, n / model.num_layers)
        f, b = exposed_s(whole, cluster.gpu, fwd_device_s, bwd_device_s)
        fwd, bwd = fwd + share * f, bwd + share * b
    return fwd, bwd
