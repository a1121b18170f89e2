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

Time: ``moe`` reruns the MoE layer's dispatch and combine (``moe.dispatch_s``: 6 calls instead of 4); the
rerun GEMMs and elementwise kernels of the listed modules are not priced in the step time yet.
"""

from __future__ import annotations

from autotune.costmodel.activations import Kernels, LayerShape, attention_core_bytes
from autotune.modelshape import qk_v_head_dims
from autotune.plan import ParallelPlan, Recompute
from autotune.specs import ModelSpec

__all__ = ["freed_bytes_per_layer"]


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
        routed_h = k.routed_saved_h * moe_share * model.experts_per_token * model.hidden_size
        width += routed_h * (1 if k.fp8_gemm_inputs else e) + (routed_ffn + shared_ffn) * per_ffn
    else:
        if "moe_act" in mods and not k.fp8_gemm_inputs:
            width += routed_ffn * e
        if "shared_experts" in mods:
            width += shared_ffn * per_ffn
    if "mlp" in mods:
        width += (1 - moe_share) * model.ffn_hidden_size * per_ffn
    freed = sb * width / tp
    if "layernorm" in mods:
        norms = moe_share + (1.0 if model.uses_mla else 0.0)
        freed += sb * model.hidden_size * norms * (1 if k.fp8_gemm_inputs else e) / side
    if "core_attn" not in mods:
        freed -= attention_core_bytes(LayerShape.of(model, plan), e, k) / tp
    return freed
