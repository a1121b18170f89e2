"""Shape arithmetic of a ``ModelSpec``: parameters by part, the active (per-token) share of an MoE block, and
how much of the sequence each layer's attention visits.

Counts follow the modules as Hugging Face and Megatron-Core build them:

- GQA attention: Q ``h x H d``, K and V ``h x kv``, O ``H d x h`` (``d`` the head width, ``kv = H_kv d``).
- MLA (DeepSeek-V2 paper, arXiv:2405.04434, Sec. 2.1.2; transformers ``modeling_deepseek_v3.py``
  ``DeepseekV3Attention``): ``q_a_proj`` ``h x r_q`` + ``q_a_layernorm`` + ``q_b_proj`` ``r_q x H(d_nope +
  d_rope)`` (or ``q_proj`` ``h x H(d_nope + d_rope)`` without ``q_lora_rank``); ``kv_a_proj_with_mqa``
  ``h x (r_kv + d_rope)`` + ``kv_a_layernorm`` + ``kv_b_proj`` ``r_kv x H(d_nope + d_v)``; ``o_proj``
  ``H d_v x h``.
- MoE block (Shazeer et al. 2017; Fedus et al. 2021 Switch; Megatron-Core ``moe_layer.py``): a router
  ``h x E`` (+ E biases for gpt-oss), ``E`` routed experts of ``num_mlp_matrices x h x f_e`` (gpt-oss adds
  biases ``(m-1) f_e + h`` each), and shared experts of total width ``f_s`` that every token visits.
- Each token runs its top-k routed experts and the shared ones: the active GEMM weights of a block.
  LatentMoE (Nemotron 3 Super / Ultra; megatron-core ``moe_layer.py``): the routed experts take
  ``latent``-wide tokens (``ModelSpec.expert_width``) behind ``fc1_latent_proj`` / ``fc2_latent_proj``
  (``h x latent`` each).
- Gated DeltaNet (transformers ``modeling_qwen3_next.py`` ``Qwen3NextGatedDeltaNet``): ``in_proj_qkvz``
  ``h x (2 K + 2 V)`` (``K = n_k d_k``, ``V = n_v d_v``), ``in_proj_ba`` ``h x 2 n_v``, a depthwise causal
  ``conv1d`` of ``2K + V`` channels without bias, ``dt_bias`` and ``A_log`` (``n_v`` each), a gated RMSNorm of
  ``d_v``, ``out_proj`` ``V x h``. Output-gated softmax attention (``Qwen3NextAttention``) widens ``q_proj``
  to ``2 H d`` (queries and the gate).
- Mamba-2 (Dao & Gu 2024, arXiv:2405.21060, Sec. 7; Megatron-Core ``ssm/mamba_mixer.py`` ``MambaMixer``):
  ``in_proj`` ``h x (2 d_in + 2 G N + H)`` (z, x, B, C, dt; ``d_in = H P``), a depthwise causal ``conv1d``
  with bias over ``d_in + 2 G N`` channels, ``dt_bias``, ``A_log`` and ``D`` (``H`` each), a gated RMSNorm
  of ``d_in``, ``out_proj`` ``d_in x h``. In a hybrid pattern every layer has one pre-norm of ``h``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.specs import ModelSpec

__all__ = [
    "attention_weight_params",
    "attention_activation_width",
    "kv_replicas",
    "dense_mlp_params",
    "routed_expert_params",
    "moe_mlp_params",
    "block_params_sum",
    "gemm_params_per_layer",
    "active_ffn_per_layer",
    "routed_width_per_layer",
    "routed_ffn_per_layer",
    "attention_span_fraction",
    "qk_v_head_dims",
    "trial_model_gap",
    "linear_widths",
    "linear_activation_width",
    "GDN_CHUNK",
    "linear_weight_params",
    "mixer_weight_params",
    "mamba_widths",
    "mamba_weight_params",
    "mamba_activation_width",
    "MAMBA_CHUNK",
    "latent_projection_params",
    "mtp_block_model",
    "mtp_module_params",
]


def qk_v_head_dims(model: ModelSpec) -> tuple[int, int]:
    """Per-head widths of the ``QK^T`` contraction and of ``PV``: ``d`` and ``d`` for GQA; MLA's
    ``d_nope + d_rope`` and ``d_v`` (Megatron-Core ``multi_latent_attention.py`` runs the core unabsorbed)."""
    if model.uses_mla:
        return model.qk_nope_head_dim + model.qk_rope_head_dim, model.v_head_dim
    return model.head_dim, model.head_dim


def attention_weight_params(model: ModelSpec) -> int:
    """Weight-matrix entries of one attention block (module docstring), biases and norms excluded."""
    h, heads = model.hidden_size, model.num_heads
    if model.uses_mla:
        qk, v = qk_v_head_dims(model)
        r_q, r_kv = model.q_lora_rank, model.kv_lora_rank
        q = h * r_q + r_q * heads * qk if r_q else h * heads * qk
        kv = h * (r_kv + model.qk_rope_head_dim) + r_kv * heads * (model.qk_nope_head_dim + v)
        return q + kv + heads * v * h
    q = heads * model.head_dim
    gate = h * q if model.attention_output_gate else 0
    return 2 * h * q + 2 * h * model.kv_hidden_size + gate


def linear_widths(model: ModelSpec) -> tuple[int, int]:
    """Gated DeltaNet's ``K = n_k d_k`` (queries and keys each) and ``V = n_v d_v`` (values, the gate ``z``
    and the output) per token."""
    return (
        model.linear_key_heads * model.linear_key_head_dim,
        model.linear_value_heads * model.linear_value_head_dim,
    )


def linear_weight_params(model: ModelSpec) -> int:
    """Weight-matrix entries of one Gated DeltaNet layer's projections (module docstring); 0 without them."""
    if not model.num_linear_layers:
        return 0
    k, v, h = *linear_widths(model), model.hidden_size
    return h * (2 * k + 2 * v) + h * 2 * model.linear_value_heads + v * h


def mixer_weight_params(model: ModelSpec) -> float:
    """Token-mixer weight entries of a block, the mean over blocks: softmax attention, Gated DeltaNet and
    Mamba-2 by their share of the layers."""
    return (
        model.softmax_share * attention_weight_params(model)
        + model.linear_share * linear_weight_params(model)
        + model.mamba_share * mamba_weight_params(model)
    )


def mamba_widths(model: ModelSpec) -> tuple[int, int]:
    """Mamba-2's ``d_in = H P`` (x, z, the scan output) and ``G N`` (B, and C) per token."""
    return model.mamba_heads * model.mamba_head_dim, model.mamba_groups * model.mamba_state_dim


def mamba_weight_params(model: ModelSpec) -> int:
    """Weight-matrix entries of one Mamba-2 layer's projections (module docstring); 0 without them."""
    if not model.mamba_heads:
        return 0
    d_in, gn = mamba_widths(model)
    return model.hidden_size * (2 * d_in + 2 * gn + model.mamba_heads) + d_in * model.hidden_size


def _mamba_part_params(model: ModelSpec) -> int:
    """A Mamba-2 layer's mixer, its convolution (with bias), ``dt_bias``, ``A_log``, ``D`` and gated norm."""
    d_in, gn = mamba_widths(model)
    conv = (d_in + 2 * gn) * (model.mamba_conv_kernel + 1)
    return mamba_weight_params(model) + conv + 3 * model.mamba_heads + d_in


MAMBA_CHUNK = 128
"""Tokens per chunk of the SSD scan (Megatron-Core ``MambaMixer`` ``chunk_size``; Dao & Gu 2024 Sec. 6)."""


def mamba_activation_width(model: ModelSpec) -> int:
    """Elements per token a Mamba-2 layer saves beyond its input, Megatron's memory-efficient path
    (``mamba_mixer.py`` ``_ssm_training`` -> ``mamba_split_conv1d_scan_combined``: it keeps the ``in_proj``
    output ``zxbcdt`` and the scan output and recomputes the convolution, ``dt`` and the chunk states in
    backward): ``zxbcdt`` (``2 d_in + 2 G N + H``), the scan output, the gated norm's input ``y silu(z)`` and
    its output (``out_proj``'s input; ``d_in`` each) and the norm's fp32 ``rstd`` per group."""
    d_in, gn = mamba_widths(model)
    return 2 * d_in + 2 * gn + model.mamba_heads + 3 * d_in + 2 * model.mamba_groups


def _linear_part_params(model: ModelSpec) -> int:
    """A Gated DeltaNet block's mixer, its convolution and small vectors, and the block's norms."""
    k, v = linear_widths(model)
    conv = (2 * k + v) * model.linear_conv_kernel
    vectors = 2 * model.linear_value_heads + model.linear_value_head_dim  # dt_bias, A_log; the norm's weight
    return linear_weight_params(model) + conv + vectors + _norm_params(model)


GDN_CHUNK = 64
"""Tokens per chunk of the chunked gated delta rule (FLA ``chunk_gated_delta_rule``, ``BT = 64``; Yang et
al. 2024, "Parallelizing Linear Transformers with the Delta Rule over Sequence Length", Sec. 3.3)."""


def kv_replicas(model: ModelSpec, tp: int) -> int:
    """How many TP ranks hold each K/V head: 1 while TP divides the KV heads; ``TP / KV heads`` when
    Megatron-Core runs a TP that is a multiple of them (megatron/core/transformer/attention.py, core_v0.16.1,
    ``num_query_groups < world_size``: the fused QKV output, split evenly, is all-gathered over TP and each
    rank keeps its group's K and V and its share of that group's queries; ``TransformerConfig`` requires the
    query groups to be a multiple or divisor of TP). MLA keeps a K/V head per query head."""
    kv = model.num_kv_heads
    return tp // kv if not model.uses_mla and kv < tp and tp % kv == 0 else 1


def _softmax_activation_width(model: ModelSpec, tp: int) -> int:
    heads = model.num_heads
    if model.uses_mla:
        qk, v = qk_v_head_dims(model)
        return model.q_lora_rank + model.kv_lora_rank + heads * (2 * qk + 2 * v)
    gate = 2 * heads * model.head_dim if model.attention_output_gate else 0
    return 2 * heads * model.head_dim + 2 * model.kv_hidden_size * kv_replicas(model, tp) + gate


def linear_activation_width(model: ModelSpec) -> int:
    """Elements per token a Gated DeltaNet layer saves beyond its input (``Qwen3NextGatedDeltaNet.forward``
    and FLA's ``ChunkGatedDeltaRuleFunction``): the convolution's input ``2K + V`` and its SiLU output (the
    kernel's ``q, k, v``), ``z`` and the kernel output ``o`` (the gated norm's inputs), the norm output
    (``out_proj``'s input), ``b, a`` and the kernel's fp32 decay ``g`` (two elements per value head each),
    and its within-chunk matrix ``A`` (``GDN_CHUNK`` per value head)."""
    k, v = linear_widths(model)
    return 2 * (2 * k + v) + 3 * v + (4 + GDN_CHUNK) * model.linear_value_heads


def attention_activation_width(model: ModelSpec, tp: int = 1) -> float:
    """Elements per token that the token mixer saves for backward beyond its input, the mean over blocks,
    before TP splits it: Q, K, V and the output projection's input (``2h + 2kv`` for MHA/GQA, Korthikanti et
    al. 2022 Sec. 4.1; K/V heads held by several TP ranks counted on each, ``kv_replicas``);
    MLA also saves its two normed latents (the inputs of ``q_b_proj`` and ``kv_b_proj``); an output gate its
    pre-activation and the ungated output (``attn_output * sigmoid(gate)``); Gated DeltaNet layers
    ``linear_activation_width``."""
    softmax = _softmax_activation_width(model, tp)
    if not model.num_linear_layers and not model.layer_pattern:
        return softmax
    linear = linear_activation_width(model) if model.num_linear_layers else 0
    mamba = model.mamba_share * mamba_activation_width(model)
    return model.softmax_share * softmax + model.linear_share * linear + mamba


def _norm_params(model: ModelSpec) -> int:
    per_norm = 2 if model.bias else 1
    mla = model.q_lora_rank + model.kv_lora_rank if model.uses_mla else 0
    return model.num_layer_norms * model.hidden_size * per_norm + mla


def dense_mlp_params(model: ModelSpec) -> int:
    return model.num_mlp_matrices * model.hidden_size * model.ffn_hidden_size


def routed_expert_params(model: ModelSpec) -> int:
    """All routed experts of one MoE layer (0 for a dense model)."""
    if not model.is_moe:
        return 0
    f, m, w = model.expert_ffn_hidden_size, model.num_mlp_matrices, model.expert_width
    each = m * w * f + (((m - 1) * f + w) if model.expert_bias else 0)
    return model.num_experts * each


def moe_mlp_params(model: ModelSpec) -> int:
    """One MoE layer's MLP: routed experts, shared experts and the router."""
    h, e = model.hidden_size, model.num_experts
    router = h * e + (e if model.expert_bias else 0)
    shared = model.num_mlp_matrices * h * model.shared_ffn_hidden_size
    return routed_expert_params(model) + shared + router + latent_projection_params(model)


def mlp_part_params(model: ModelSpec, *, moe: bool) -> int:
    """What tells an MoE block from a dense-MLP one in ``block_params_sum``: its MLP terms."""
    return moe_mlp_params(model) if moe else dense_mlp_params(model) + _gpt_biases(model)


def latent_projection_params(model: ModelSpec) -> int:
    """LatentMoE's ``fc1_latent_proj`` (h -> latent) and ``fc2_latent_proj`` (latent -> h) of one MoE layer
    (megatron-core ``moe_layer.py``; no bias); 0 without a latent."""
    return 2 * model.hidden_size * model.moe_latent_size


def _gpt_biases(model: ModelSpec) -> int:
    """GPT-2/3 biases of one block (Narayanan Sec. 5.1's 13h with ffn = 4h)."""
    if not model.bias:
        return 0
    h, kv, f = model.hidden_size, model.kv_hidden_size, model.ffn_hidden_size
    return h + 2 * kv + h + (model.num_mlp_matrices - 1) * f + h


def _attention_part_params(model: ModelSpec) -> int:
    """A block's attention weights and biases and its norms: everything but the MLP."""
    attn_bias = 2 * model.kv_hidden_size + model.num_heads * model.head_dim if model.attention_bias else 0
    return attention_weight_params(model) + _norm_params(model) + attn_bias


def block_params_sum(model: ModelSpec) -> int:
    """Parameters of all transformer blocks (embeddings and the final norm excluded); of a hybrid pattern's
    layers, each with one pre-norm."""
    num_moe = len(model.moe_layers)
    num_dense = model.num_dense_mlp_layers
    if model.layer_pattern:
        pattern, attention = model.layer_pattern, _attention_part_params(model) - _norm_params(model)
        return (
            pattern.count("*") * attention
            + pattern.count("M") * _mamba_part_params(model)
            + model.num_layers * model.hidden_size * (2 if model.bias else 1)
            + num_dense * (dense_mlp_params(model) + _gpt_biases(model))
            + num_moe * moe_mlp_params(model)
        )
    linear = model.num_linear_layers
    return (
        (model.num_layers - linear) * _attention_part_params(model)
        + (linear * _linear_part_params(model) if linear else 0)
        + num_dense * (dense_mlp_params(model) + _gpt_biases(model))
        + num_moe * moe_mlp_params(model)
    )


def mtp_module_params(model: ModelSpec) -> int:
    """One multi-token prediction module (``ModelSpec.mtp_layers``; Megatron-Core
    ``multi_token_prediction.py`` ``MultiTokenPredictionLayer``, DeepSeek-V3 report Sec. 2.2): a block of the
    last layer's type (MoE when it is an MoE layer) or a hybrid's ``mtp_pattern`` layers
    (``mtp_block_model``), ``enorm``, ``hnorm`` and its final norm, and ``eh_proj`` (2h x h); embedding and
    head are the main model's."""
    h = model.hidden_size
    block = mtp_block_model(model)
    if block is not None:
        return block_params_sum(block) + 2 * h * h + 3 * h
    last_is_moe = model.is_moe and model.num_layers - 1 in model.moe_layers
    mlp = moe_mlp_params(model) if last_is_moe else dense_mlp_params(model) + _gpt_biases(model)
    return _attention_part_params(model) + mlp + 2 * h * h + 3 * h


@functools.lru_cache(maxsize=64)
def mtp_block_model(model: ModelSpec) -> ModelSpec | None:
    """A hybrid model's MTP block as a model of its own: the ``mtp_pattern`` layers (Nemotron 3's ``*E``: an
    attention and an MoE layer; megatron-core 0.17 ``MultiTokenPredictionBlock`` builds them as a
    ``MambaStack`` of that pattern), so that every per-layer term prices that block's mean layer; None
    without a pattern (the MTP block is then priced as the main model's mean block)."""
    pattern = model.mtp_pattern
    if not (model.mtp_layers and pattern):
        return None
    return dataclasses.replace(
        model,
        name=f"{model.name} MTP block",
        num_layers=len(pattern),
        layer_pattern=pattern,
        moe_layers=tuple(i for i, kind in enumerate(pattern) if kind == "E"),
        mtp_layers=0,
        mtp_pattern="",
        mtp_shared=False,
    )


def gemm_params_per_layer(model: ModelSpec) -> float:
    """Weight entries one token multiplies through in a block, the mean over blocks: attention, the dense
    MLP or (MoE layers) the router, top-k routed experts and the shared experts. ``2 x`` this is the
    block's forward GEMM FLOPs per token."""
    m, h = model.num_mlp_matrices, model.hidden_size
    num_moe = len(model.moe_layers)
    dense = model.num_dense_mlp_layers * dense_mlp_params(model)
    moe = num_moe * (
        model.experts_per_token * m * model.expert_width * model.expert_ffn_hidden_size
        + m * h * model.shared_ffn_hidden_size
        + h * model.num_experts
        + latent_projection_params(model)
    )
    return mixer_weight_params(model) + (dense + moe) / model.num_layers


def active_ffn_per_layer(model: ModelSpec) -> float:
    """MLP intermediate width a token passes through, the mean over blocks (``ffn`` for a dense model;
    ``top-k x f_e + f_s`` in an MoE layer): what the MLP's activations and elementwise kernels scale with."""
    num_moe = len(model.moe_layers)
    moe = num_moe * (model.experts_per_token * model.expert_ffn_hidden_size + model.shared_ffn_hidden_size)
    return (model.num_dense_mlp_layers * model.ffn_hidden_size + moe) / model.num_layers


def routed_ffn_per_layer(model: ModelSpec) -> float:
    """The routed experts' part of ``active_ffn_per_layer``: ``top-k x f_e`` in an MoE layer, the mean over
    blocks (0 for a dense model)."""
    return len(model.moe_layers) * model.experts_per_token * model.expert_ffn_hidden_size / model.num_layers


def routed_width_per_layer(model: ModelSpec) -> float:
    """``h``-wide token copies an MoE layer makes per token, the mean over blocks: the ``top-k`` permuted
    copies of the input that go to the experts (Megatron-Core ``moe_utils.py`` ``permute``)."""
    return len(model.moe_layers) * model.experts_per_token * model.expert_width / model.num_layers


def trial_model_gap(model: ModelSpec) -> str | None:
    """What the built-in trial workload (``autotune/trials/model.py``: a Llama/GPT block, an MoE layer
    (``trials/moe.py``) on ``moe_layers``, ``hidden / heads`` heads and global attention) would leave out of
    ``model``; None when it builds it as priced. Real trials of such a model would measure another model."""
    gaps = [
        (model.expert_bias, "expert biases"),
        (model.uses_mla, "multi-head latent attention"),
        (bool(model.attention_head_dim), "explicit head widths (head_dim)"),
        (bool(model.num_local_layers), "sliding-window / chunked attention layers"),
        (model.attention_bias, "attention biases"),
        (model.num_layer_norms not in (2, 1 if model.layer_pattern else 2), "Gemma-2's four norms"),
        (bool(model.mtp_layers), "multi-token prediction modules"),
        (bool(model.num_linear_layers), "Gated DeltaNet layers"),
        (model.attention_output_gate, "output-gated attention"),
        (bool(model.layer_pattern), "a hybrid pattern of Mamba-2 and single-sub-layer layers"),
        (bool(model.moe_latent_size), "LatentMoE projections"),
    ]
    missing = [what for present, what in gaps if present]
    return ", ".join(missing) or None


def _local_fraction(window: int, seq_len: int, chunked: bool) -> float:
    """Mean keys a causal query visits over ``seq_len``: ``w - w^2/2s`` with a sliding window ``w < s``
    (the first ``w`` queries see fewer), ``c/2`` within chunks of ``c`` (Llama 4's chunked attention)."""
    w = min(window, seq_len)
    if chunked:
        return w / 2 / seq_len
    return (w - w * w / (2 * seq_len)) / seq_len


def attention_span_fraction(model: ModelSpec, seq_len: int, causal_fraction: float) -> float:
    """Share of the full ``s x s`` score work a layer does, the mean over layers. A global layer does
    ``causal_fraction`` of it (the caller's convention: 1 for MFU, 0.5 for what a causal kernel executes,
    ``flops.CAUSAL_ATTENTION_FRACTION``); a local layer its window's share, scaled the same way (so a
    window as long as the sequence counts as a global layer)."""
    if not model.num_local_layers or not model.attention_window:
        return causal_fraction
    local = _local_fraction(model.attention_window, seq_len, model.chunked_attention) * causal_fraction / 0.5
    n_local = model.num_local_layers
    return (n_local * local + (model.num_layers - n_local) * causal_fraction) / model.num_layers
