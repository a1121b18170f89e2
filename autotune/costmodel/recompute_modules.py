"""Megatron's per-module selective recompute (``--recompute-granularity selective --recompute-modules``,
``plan.recompute_modules``): the activation bytes each listed module stops keeping for backward.

Megatron-Core ``transformer_config.py`` ``recompute_modules`` (default ``["core_attn"]``, what a plan's plain
``selective`` prices). Each module is wrapped in ``tensor_parallel.CheckpointWithoutOutput`` (or checkpointed
whole, ``moe``/``mlp``/``shared_experts``) and rerun in backward; what it frees, per token of one micro-batch
on one rank, the mean over the model's blocks (the convention of ``activations.tp_split_bytes``):

- ``core_attn``: the attention core's own tensors (``activations.attention_core_bytes``); left out of the
  list, the core keeps them (``transformer_layer.py`` checkpoints it only when listed);
- ``layernorm``: the output of each norm that is its own module (``transformer_layer.py``
  ``recompute_input_layernorm`` / ``recompute_pre_mlp_layernorm``; a norm fused into
  ``TELayerNormColumnParallelLinear`` is an ``IdentityOp`` there and keeps nothing to free): the pre-MLP
  norm of MoE blocks (the router's input) and MLA's input norm (``multi_latent_attention.py`` projects it
  twice), at the bytes ``activations.norm_side_bytes`` counts for it (1 B under fp8);
- ``mla_up_proj``: MLA's up-projected Q, K, V (``multi_latent_attention.py`` ``qkv_up_checkpoint``
  discards them after the core attention): ``heads x (2 (d_nope + d_rope) + d_v)`` per token;
- ``moe_act``: the experts' activation output (``moe/experts.py`` ``TEGroupedMLP``
  ``activation_checkpoint``), one expert-ffn-wide tensor per routed copy; under fp8 FC2 keeps its own
  quantized input (what ``activations`` prices), so nothing priced is freed;
- ``moe``: the whole MoE layer but its input (``transformer_layer.py`` checkpoints ``self.mlp``): the routed
  copies, the expert and shared-expert MLP tensors;
- ``shared_experts``: the shared experts' MLP tensors (``moe/shared_experts.py``);
- ``mlp``: the MLP tensors of dense blocks (``transformer_layer.py``: not applied to an ``MoELayer``).

Time (``rerun_s``): each listed module runs its forward again in backward, and only those: ``core_attn``
the attention core (left out, nothing of the core reruns); ``layernorm`` the norms it frees (one read and
one write of ``h`` each); ``mla_up_proj`` MLA's ``linear_q_up_proj`` and ``linear_kv_up_proj`` GEMMs;
``moe_act`` the experts' gated activation over every routed copy (``weighted_bias_swiglu_impl``: read two
expert-ffn-wide halves, write one); ``shared_experts`` the shared experts' GEMMs and activation; ``moe`` the
router, the expert and shared-expert GEMMs, and the MoE layer's memory-bound kernels (permute, regroup,
activation), its dispatch and combine being ``moe.dispatch_s``'s (6 calls instead of 4); ``mlp`` the dense
blocks' MLP GEMMs and activation. GEMMs run at their shape's efficiency (``kernels.gemm_s``); fp8 casts and
RoPE of the reruns are left out (a few percent of what they rerun).
"""

from __future__ import annotations

import math

from autotune.costmodel import kernels, moe
from autotune.costmodel.activations import Kernels, LayerShape, attention_core_bytes
from autotune.costmodel.kernels import HBM_EFFICIENCY
from autotune.modelshape import qk_v_head_dims, routed_width_per_layer
from autotune.plan import ParallelPlan, Recompute
from autotune.specs import ClusterSpec, ModelSpec

__all__ = ["freed_bytes_per_layer", "rerun_s"]


def freed_bytes_per_layer(model: ModelSpec, plan: ParallelPlan, *, e: int, k: Kernels) -> float:
    """Bytes of one (mean) block and micro-batch on one rank that ``plan.recompute_modules`` frees beyond
    what the plan's ``recompute`` already prices (module docstring); negative when ``core_attn`` is left
    out (the core then keeps its tensors). 0 without a module list."""
    mods = set(plan.recompute_modules)
    if plan.recompute is not Recompute.SELECTIVE or not mods or k.op_sac:
        return 0.0
    sb, tp = plan.seq_len / plan.cp * plan.micro_batch, plan.tp
    side = tp if plan.sequence_parallel else 1
    n = model.num_layers
    moe_share = len(model.moe_layers) / n
    per_ffn = ((3 if k.fused_swiglu else 4) if model.gated_mlp else 2) * e
    if k.fp8_gemm_inputs:  # FC1 input and FC2 input saved in fp8 (activations.tp_split_bytes)
        per_ffn -= e - 1
    width = 0.0  # elements x bytes per token, divided by TP
    if "mla_up_proj" in mods and model.uses_mla:
        qk, v = qk_v_head_dims(model)
        width += model.num_heads * (2 * qk + v) * e
    routed_ffn = moe_share * model.experts_per_token * model.expert_ffn_hidden_size
    shared_ffn = moe_share * model.shared_ffn_hidden_size
    if "moe" in mods:
        routed_h = k.routed_saved_h * moe_share * model.experts_per_token * model.expert_width
        width += routed_h * (1 if k.fp8_gemm_inputs else e) + (routed_ffn + shared_ffn) * per_ffn
    else:
        if "moe_act" in mods and not k.fp8_gemm_inputs:
            width += routed_ffn * e
        if "shared_experts" in mods:
            width += shared_ffn * per_ffn
    if "mlp" in mods:
        width += _dense_share(model, moe_share) * model.ffn_hidden_size * per_ffn
    freed = sb * width / tp
    if "layernorm" in mods:
        norms = moe_share + (1.0 if model.uses_mla else 0.0)
        freed += sb * model.hidden_size * norms * (1 if k.fp8_gemm_inputs else e) / side
    if "core_attn" not in mods:
        freed -= attention_core_bytes(LayerShape.of(model, plan), e, k) / tp
    return freed


def rerun_s(
    model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, tokens: float, core_s: float
) -> float | None:
    """Forward seconds one (mean) block reruns in backward per micro-batch under ``plan.recompute_modules``
    (module docstring), for ``tokens`` tokens of the micro-batch on one rank; ``core_s`` is the attention
    core's forward. None without a module list: the plan's ``selective`` then reruns the core alone."""
    mods = set(plan.recompute_modules)
    if plan.recompute is not Recompute.SELECTIVE or not mods:
        return None
    moe_share = len(model.moe_layers) / model.num_layers if model.is_moe else 0.0
    s = core_s if "core_attn" in mods else 0.0
    s += _bytes_s(cluster, tokens * _rerun_bytes_per_token(model, plan, mods, moe_share))
    if "mla_up_proj" in mods and model.uses_mla:
        qk, v = qk_v_head_dims(model)
        heads = model.num_heads / plan.tp
        if model.q_lora_rank:
            s += _gemm_s(cluster, plan, tokens, heads * qk, model.q_lora_rank)
        s += _gemm_s(cluster, plan, tokens, heads * (model.qk_nope_head_dim + v), model.kv_lora_rank)
    if "moe" in mods and moe_share:
        s += moe_share * _gemm_s(cluster, plan, tokens / plan.tp, model.num_experts, model.hidden_size)
        s += moe_share * _experts_gemm_s(model, cluster, plan, tokens)
    if mods & {"moe", "shared_experts"}:
        s += moe_share * _mlp_gemm_s(model, cluster, plan, tokens, model.shared_ffn_hidden_size)
    if "mlp" in mods:
        s += _dense_share(model, moe_share) * _mlp_gemm_s(model, cluster, plan, tokens, model.ffn_hidden_size)
    return s


def _dense_share(model: ModelSpec, moe_share: float) -> float:
    """Share of the layers with a dense MLP: all but the MoE ones, or a hybrid pattern's ``-``."""
    return model.num_dense_mlp_layers / model.num_layers if model.layer_pattern else 1.0 - moe_share


def _rerun_bytes_per_token(model: ModelSpec, plan: ParallelPlan, mods: set[str], moe_share: float) -> float:
    """HBM bytes per token of the reruns' memory-bound kernels (16-bit): norms, activations, and for
    ``moe`` the permute / unpermute (``flops.elementwise_bytes_per_token``) and the regrouping
    (``moe.regroup_bytes_per_token``) of the routed copies."""
    act = 6 if model.gated_mlp else 4  # read + write per output element: 2 + 1 (gated) or 1 + 1 halves
    side = plan.tp if plan.sequence_parallel else 1
    b = 0.0
    if "layernorm" in mods:
        b += 4 * model.hidden_size * (moe_share + (1.0 if model.uses_mla else 0.0)) / side
    routed_ffn = moe_share * model.experts_per_token * model.expert_ffn_hidden_size / plan.tp
    if mods & {"moe", "moe_act"}:
        b += act * routed_ffn
    if mods & {"moe", "shared_experts"}:
        b += act * moe_share * model.shared_ffn_hidden_size / plan.tp
    if "moe" in mods and moe_share:
        routed = routed_width_per_layer(model) * moe.busiest_load(plan)
        b += 2 * 4 * routed / plan.tp + moe.regroup_bytes_per_token(model, plan)
    if "mlp" in mods:
        b += act * _dense_share(model, moe_share) * model.ffn_hidden_size / plan.tp
    return b


def _bytes_s(cluster: ClusterSpec, nbytes: float) -> float:
    return nbytes / (cluster.gpu.memory_bandwidth_bytes_per_s * HBM_EFFICIENCY)


def _gemm_s(cluster: ClusterSpec, plan: ParallelPlan, m: float, n: float, k: float) -> float:
    return kernels.gemm_s(cluster.gpu, str(plan.precision), m, n, k)


def _mlp_gemm_s(
    model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, tokens: float, ffn: float
) -> float:
    """A (shared-expert or dense) MLP's forward GEMMs, split over TP, gate and up fused (``linear_fc1``)."""
    if ffn <= 0:
        return 0.0
    up, h = model.num_mlp_matrices - 1, model.hidden_size
    fc1 = _gemm_s(cluster, plan, tokens, up * ffn / plan.tp, h)
    return fc1 + _gemm_s(cluster, plan, tokens, h, ffn / plan.tp)


def _experts_gemm_s(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, tokens: float) -> float:
    """The local experts' forward GEMMs of one MoE layer (``gemms.block_gemms``' routed-expert shapes, tile
    rows included, for a model of MoE layers only)."""
    rows = moe.tokens_per_expert(model, plan, tokens) * moe.busiest_load(plan)
    rows = math.ceil(rows / moe.GEMM_TILE_ROWS) * moe.GEMM_TILE_ROWS if rows > 0 else 0.0
    up, h, f_e = model.num_mlp_matrices - 1, model.expert_width, model.expert_ffn_hidden_size / plan.etp
    local = model.num_experts / plan.ep
    return local * (_gemm_s(cluster, plan, rows, up * f_e, h) + _gemm_s(cluster, plan, rows, h, f_e))
