"""The ``config.json`` keys autotune knows: those that set the shape it prices (``PRICED_KEYS``) and those
that leave a training step's compute and memory unchanged (``NEUTRAL_KEYS``, each with why). Any other key is
refused by ``modelconfig.check_keys``; the families behind the names are listed in ``modelconfig``.
"""

from __future__ import annotations

__all__ = ["PRICED_KEYS", "NEUTRAL_KEYS"]

PRICED_KEYS = frozenset(
    {
        "model_type",
        "hidden_size",
        "n_embd",
        "num_hidden_layers",
        "n_layer",
        "num_attention_heads",
        "n_head",
        "num_key_value_heads",
        "intermediate_size",
        "n_inner",
        "vocab_size",
        "max_position_embeddings",
        "n_positions",
        "n_ctx",
        "tie_word_embeddings",
        "hidden_act",
        "activation_function",
        "hidden_activation",
        "head_dim",
        "attention_bias",
        "num_local_experts",
        "num_experts",
        "n_routed_experts",
        "num_experts_per_tok",
        "experts_per_token",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "n_shared_experts",
        "first_k_dense_replace",
        "moe_layer_freq",
        "decoder_sparse_step",
        "mlp_only_layers",
        "moe_layers",
        "interleave_moe_layer_step",
        "intermediate_size_mlp",
        "q_lora_rank",
        "kv_lora_rank",
        "qk_rope_head_dim",
        "qk_nope_head_dim",
        "v_head_dim",
        "sliding_window",
        "use_sliding_window",
        "max_window_layers",
        "layer_types",
        "attention_chunk_size",
        "no_rope_layers",
        "sliding_window_pattern",
        "source",
        "num_nextn_predict_layers",  # ModelSpec.mtp_layers
        "moe_num_experts",  # ERNIE 4.5's names (transformers Ernie4_5_MoeConfig)
        "moe_k",
        "moe_num_shared_experts",
        "moe_layer_start_index",
        "moe_layer_end_index",
        "moe_layer_interval",
        "use_bias",
        "full_attention_interval",  # Qwen3-Next: every N-th layer softmax, the others Gated DeltaNet
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_conv_kernel_dim",
        "attn_output_gate",  # Qwen3.5: output-gated softmax attention (always on in Qwen3-Next)
        "mtp_num_hidden_layers",  # Qwen3.5 / Qwen3-Next's MTP modules (ModelSpec.mtp_layers)
        "shared_intermediate_size",  # MiniMax-M2's names (MiniMaxM2Config): shared experts' width
        "attn_type_list",  # 1 = softmax attention on that layer (0, lightning attention, is refused)
        "use_mtp",
        "num_mtp_modules",
        "mtp_transformer_layers",
        "hybrid_override_pattern",  # Nemotron-H / Nemotron 3 (NemotronHConfig): ModelSpec.layer_pattern
        "layers_block_type",  # the same as a list: "mamba" / "linear_attention", "attention" / ..., "moe"
        "mamba_num_heads",
        "mamba_head_dim",
        "ssm_state_size",
        "n_groups",  # Mamba-2's B/C groups (not DeepSeek's router ``n_group``)
        "conv_kernel",
        "chunk_size",  # the SSD scan's chunk, priced at modelshape.MAMBA_CHUNK (others refused)
        "mlp_hidden_act",  # NemotronH's MLP activation: relu2 (a two-matrix MLP)
        "moe_shared_expert_intermediate_size",
        "mamba_proj_bias",
        "use_conv_bias",
        "moe_latent_size",  # Nemotron 3 Super / Ultra's LatentMoE: ModelSpec.moe_latent_size
        "mtp_layers_block_type",  # NemotronH's MTP block: ModelSpec.mtp_pattern (modelconfig._hybrid_mtp)
        "mtp_hybrid_override_pattern",
        "mtp_use_repeated_layer",  # one MTP module run at every depth: ModelSpec.mtp_shared
        # refused unless they leave the cost unchanged (``_REFUSED``):
        "mlp_bias",
        "text_config",
        "vision_config",
        "attention_dropout",
        "hidden_dropout",
        "dropout",
        "resid_pdrop",
        "embd_pdrop",
        "attn_pdrop",
    }
)
"""Keys that set the shape ``ModelSpec`` prices (or are refused when their value would need more)."""

_POSITION = "position encoding variant: elementwise on Q/K, no parameters or GEMMs"
_META = "metadata, token ids or inference settings: no effect on a training step"
_ROUTING = "which experts a token picks, not how many (top-k is priced); balance is costmodel.moe's"
_INIT = "numerics or initialisation only"
_SCALAR = "a scalar or clamp inside a fused kernel: no GEMM, no saved tensor"
NEUTRAL_KEYS: dict[str, str] = {
    **dict.fromkeys(
        (
            "rope_theta",
            "rope_scaling",
            "rope_parameters",
            "rope_interleave",
            "rope_local_base_freq",
            "no_rope_layer_interval",
            "initial_context_length",
            "original_max_position_embeddings",  # Phi-3 / Phi-4 LongRoPE
            "partial_rotary_factor",  # Phi, StableLM, GLM-4: RoPE on part of each head
            "rotary_pct",  # GPT-NeoX's name for it
            "rotary_emb_base",  # GPT-NeoX's rope_theta
            "rotary_dim",  # MiniMax-M2: RoPE on part of each head
        ),
        _POSITION,
    ),
    **dict.fromkeys(
        ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "initializer_range", "initializer_factor"),
        _INIT,
    ),
    **dict.fromkeys(
        (
            "bos_token_id",
            "eos_token_id",
            "pad_token_id",
            "torch_dtype",
            "dtype",
            "architectures",
            "transformers_version",
            "use_cache",
            "auto_map",
            "cache_implementation",
            "_name_or_path",
            "ep_size",
            "pretraining_tp",
            "summary_type",
            "summary_use_proj",
            "summary_activation",
            "summary_proj_to_labels",
            "summary_first_dropout",
            "task_specific_params",
        ),
        _META,
    ),
    **dict.fromkeys(
        (
            "router_aux_loss_coef",
            "output_router_logits",
            "aux_loss_alpha",
            "seq_aux",
            "norm_topk_prob",
            "routed_scaling_factor",
            "scoring_func",
            "topk_method",
            "n_group",
            "topk_group",
            "router_jitter_noise",
            "input_jitter_noise",  # PhiMoE: noise on the experts' input in training, elementwise
            "moe_gate",  # ERNIE 4.5: "topk"
            "moe_use_aux_free",  # ERNIE 4.5: a per-expert score bias instead of an auxiliary loss
            "use_routing_bias",  # MiniMax-M2: the same
            "shared_moe_mode",  # MiniMax: how the shared expert's output is gated
        ),
        _ROUTING,
    ),
    **dict.fromkeys(
        (
            "attn_logit_softcapping",
            "final_logit_softcapping",
            "query_pre_attn_scalar",
            "swiglu_limit",
            "swiglu_alpha",
            "attn_temperature_tuning",
            "floor_scale",
            "attn_scale",
            "scale_attn_weights",
            "scale_attn_by_inverse_layer_idx",
            "reorder_and_upcast_attn",
            "clip_qkv",  # OLMo: a clamp on the QKV output
            "attention_multiplier",  # Granite's scalar multipliers
            "embedding_multiplier",
            "residual_multiplier",
            "logits_scaling",
            "logit_scale",  # Cohere
            "moe_norm_min",  # ERNIE 4.5: the floor of the top-k weights' normaliser
            "postnorm",  # MiniMax: the norm after the residual add (same parameters and work)
            *(
                f"layernorm_{p}_{c}"
                for p in ("full_attention", "linear_attention", "mlp")
                for c in ("alpha", "beta")
            ),
            *(f"{p}_{c}_factor" for p in ("full_attn", "linear_attn", "mlp") for c in ("alpha", "beta")),
        ),
        _SCALAR,
    ),
    "lm_head_bias": "a bias on the output head: vocab_size parameters (< 0.001 % of a model), no GEMM",
    "qk_norm_type": "where MiniMax-M2's QK RMSNorm applies: elementwise work either way",
    "use_qk_norm": "per-head RMSNorm on Q and K: 2 x head_dim parameters and elementwise work",
    "quantization_config": "the checkpoint's storage format; training runs at the plan's --precision",
    "moe_capacity": "the reference router's token capacity; autotune's is the plan's --moe-capacity-factor",
    "expand": "Mamba-2's d_inner / hidden; NemotronH's d_inner is mamba_num_heads x mamba_head_dim",
    "mamba_hidden_act": "the SiLU after Mamba-2's convolution: one elementwise kernel, priced as such",
    "mamba_ssm_cache_dtype": "the dtype of the inference-time SSM state cache",
    "use_mamba_kernels": "whether transformers calls mamba_ssm's kernels (the ones priced) or a slow path",
    "time_step_min": "Mamba-2's dt initialisation range",
    "time_step_max": "Mamba-2's dt initialisation range",
    "time_step_floor": "Mamba-2's dt initialisation floor",
    "time_step_limit": "a clamp on Mamba-2's dt inside the scan kernel",
    "rescale_prenorm_residual": "initialisation of the output projections",
    "residual_in_fp32": "NemotronH's residual dtype at inference; Megatron trains it in the plan's dtype",
    "num_logits_to_keep": "how many positions the inference head computes",
    "norm_eps": "numerics only",
    "norm_type": "RMSNorm or LayerNorm (StarCoder2's key): one elementwise kernel either way",
}
"""Keys that do not change a training step's compute or memory as autotune prices it, each with why."""
