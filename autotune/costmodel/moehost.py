"""Host time a Megatron-Core MoE layer leaves on the critical path.

The dropless token dispatchers bring the tokens-per-expert counts to the host in every MoE layer of every
micro-batch: the all-to-all splits and the grouped GEMM's ``m_splits`` are host lists
(``megatron/core/transformer/moe/token_dispatcher.py`` ``MoEAlltoAllTokenDispatcher.preprocess`` ->
``_maybe_dtoh_and_synchronize``: ``.to("cpu")`` on a side stream, then ``d2h_event.synchronize()`` at
``cuda_sync_point``, "before_ep_alltoall" with EP > 1, "before_finish" without). The host waits there
until the GPU has run everything queued, so it cannot run ahead of the device: the kernels of the layer up
to the next layer's sync run no faster than the host issues them. Per MoE layer and micro-batch the forward
takes ``max(device, host)``; the backward has no sync (the splits are kept), but starts from an empty queue
behind the last forward sync, so it too takes ``max(device, host)``. With padding to capacity
(``plan.moe_capacity_factor``: ``drop_and_pad``, every split is ``capacity``) ``preprocess`` returns
before any device-to-host copy and the sync is skipped: the host runs ahead, and a layer's host time shows
only where it passes the device's over the whole forward and backward.
The GPU idles through the exposed host time, so the DP collectives already queued on their own streams
run then: ``steptime`` counts it in the window they hide behind (``BlockTimes.moe_sync_s``).

Host time = host-visible operations x ``HOST_OP_S``. The operations per layer are counted at the level of
the Python call sites in Megatron-Core and Transformer Engine (each an ATen operator or a TE extension call;
every grouped-GEMM expert a cuBLAS launch of its own: ``transformer_engine/pytorch/module/grouped_linear.py``
``_GroupedLinear.forward`` / ``backward`` call ``general_grouped_gemm`` over ``m_splits``, one GEMM per local
expert, and the backward two, plus one ``main_grad`` placeholder per expert under Megatron's
``fuse_wgrad_accumulation``). The counts are approximate (+-30 %: fused paths differ by version, and
``--moe-router-fusion`` / ``--moe-permute-fusion`` are assumed on, as in NVIDIA's recipes); the per-expert
part is exact in form. CUDA graphs (``--cuda-graph-impl``, scopes ``attn``, ``moe_router``,
``moe_preprocess``) would remove the launches of the captured scopes: not a plan field, not priced.
Only Megatron is priced: torchtitan's ``ExpertParallel`` also syncs (``.tolist()`` of the splits) but its
operation counts were not read.
"""

from __future__ import annotations

from autotune.plan import Framework, ParallelPlan, Recompute
from autotune.specs import ModelSpec

__all__ = ["HOST_OP_S", "FWD_OPS", "BWD_OPS", "layer_ops", "exposed_s"]

HOST_OP_S = 17.2e-6
"""Host seconds per host-visible operation of an eager PyTorch training step on a GPU server: the H200
validation of autotune's trial model (benchmarks/results/gpu_validate.json, torch 2.11, Python 3.12, llama-1b,
one micro-batch of 2048 tokens) is host-bound at micro-batch 1 (0.076 s against 0.088 s at micro-batch 2);
its step time over the operators it dispatches (``hostops``: 102 + 141 per block, 56 more with selective
and 102 with full recompute, 51 outside the blocks) is 17.2, 17.2 and 17.0 us for no, selective and full
recompute (``python benchmarks/host_op_cost.py`` -> benchmarks/results/host_op_cost.md)."""

DROPLESS_PREPROCESS_OPS = 21
"""The dropless dispatcher's preprocess (FWD_OPS)."""
FWD_OPS = (
    (
        "attention: fused norm + QKV, q/k norms, RoPE, fused attention, projection, bias-dropout-add, "
        "pre-MLP norm (TE modules)",
        15,
    ),
    (
        "router: fp32 gating GEMM, fused top-k + score, aux loss and its bookkeeping (router.py TopKRouter)",
        10,
    ),
    (
        "dispatcher preprocess: tokens per expert, splits, all-gather of the counts, device-to-host copies "
        "and the sync (token_dispatcher.py preprocess / _maybe_dtoh_and_synchronize)",
        DROPLESS_PREPROCESS_OPS,
    ),
    ("permute, sort by local expert, unsort, unpermute of tokens and probabilities (moe_utils.py, fused)", 8),
    ("all-to-alls: tokens and probabilities out, expert outputs back, with their buffers", 6),
    (
        "grouped MLP without its GEMMs: split, multi-quantize and output buffer of two GroupedLinears, "
        "weighted SwiGLU (experts.py TEGroupedMLP)",
        10,
    ),
    ("residual add", 1),
)
"""Forward operations of one MoE layer besides the per-expert GEMMs (``layer_ops``)."""
BWD_OPS = (
    ("attention backward (autograd of the TE modules above)", 20),
    ("router backward and aux-loss gradient", 10),
    ("all-to-all, permute and sort backward", 14),
    ("grouped MLP backward without its GEMMs (split, quantize, buffers; SwiGLU backward)", 10),
)
"""Backward operations of one MoE layer besides the per-expert GEMMs."""
FWD_OPS_PER_EXPERT = 2
"""One GEMM per local expert in each of the two GroupedLinears (``general_grouped_gemm``)."""
BWD_OPS_PER_EXPERT = 6
"""Per GroupedLinear and local expert: the data-gradient GEMM, the weight-gradient GEMM and the
``main_grad`` placeholder (``handle_custom_ddp_from_mcore``)."""


PADDED_PREPROCESS_OPS = 3
"""Dispatcher preprocess when padded to capacity: the capacity and two ``torch.full`` split tensors
(``token_dispatcher.py`` ``preprocess``, ``drop_and_pad`` branch), in place of FWD_OPS' 21."""
TOKEN_DROP_OPS = 8
"""The router's token dropping (``moe_utils.py`` ``apply_router_token_dropping``: the capacity, top-k of the
probabilities along the tokens, scatter into a keep mask, mask the map and the probabilities, padding)."""


def layer_ops(model: ModelSpec, plan: ParallelPlan) -> tuple[int, int]:
    """(forward, backward) host-visible operations of one MoE layer per micro-batch (module docstring);
    full recompute reruns the forward in the backward."""
    local = model.num_experts // plan.ep
    fwd = sum(n for _, n in FWD_OPS) + FWD_OPS_PER_EXPERT * local
    if plan.moe_capacity_factor is not None:
        fwd += PADDED_PREPROCESS_OPS + TOKEN_DROP_OPS - DROPLESS_PREPROCESS_OPS
    bwd = sum(n for _, n in BWD_OPS) + BWD_OPS_PER_EXPERT * local
    return fwd, bwd + (fwd if plan.recompute is Recompute.FULL else 0)


def exposed_s(model: ModelSpec, plan: ParallelPlan, fwd_device_s: float, bwd_device_s: float) -> float:
    """Host seconds of one (mean) block per micro-batch that the device does not hide: per MoE layer
    ``max(0, host - device)`` in forward and in backward, weighted by the share of MoE layers."""
    if not model.is_moe or plan.framework is not Framework.MEGATRON:
        return 0.0
    fwd, bwd = layer_ops(model, plan)
    share = len(model.moe_layers) / model.num_layers
    if plan.moe_capacity_factor is not None:  # no sync: the host runs ahead (module docstring)
        return share * max(0.0, (fwd + bwd) * HOST_OP_S - fwd_device_s - bwd_device_s)
    return share * (max(0.0, fwd * HOST_OP_S - fwd_device_s) + max(0.0, bwd * HOST_OP_S - bwd_device_s))
