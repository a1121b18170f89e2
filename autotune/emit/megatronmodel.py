"""ModelSpec -> the Megatron-LM flags that build its architecture (pure; ``emit.megatron`` adds the plan's).

Flag names are Megatron-LM's (``megatron/training/arguments.py`` and the ``TransformerConfig`` fields it turns
into flags): the dense core, MoE (``--num-experts``, ``--moe-router-topk``, ``--moe-ffn-hidden-size``, shared
experts, ``--moe-layer-freq`` as a Python list expression for dense first layers, grouped GEMM and the
dispatcher the cost model prices: ``alltoall``, or ``flex`` with the plan's DeepEP / HybridEP backend), MLA
(``--multi-latent-attention``; ``--qk-head-dim`` is the non-RoPE part, ``--qk-pos-emb-head-dim`` the RoPE
part), Gated DeltaNet (``--experimental-attention-variant gated_delta_net``, ``_gdn_args``) and hybrid
Mamba-2 models (Nemotron-H, Nemotron 3: their pattern, Mamba-2 heads and ``--spec`` for
``pretrain_mamba.py``, ``_hybrid_args``, ``megatron_entry``), and what defines the model without costing a
step (``autotune.definition``): the activation, the norm, the MoE router, RoPE base, share and long-context
scaling, the Q/K norm, the norms' epsilon, a sliding window on every layer (``--window-size``:
Megatron-Bridge writes HF's window ``W`` as ``(W - 1, 0)``), as Megatron-LM core_v0.16.1 spells them
(``_definition_args``, ``_router_args``); what it cannot spell leaves the file out with the reason
(``megatron_model_unsupported``).
"""

from __future__ import annotations

from autotune.errors import ConfigError
from autotune.plan import MoeDispatcher
from autotune.specs import ModelSpec

__all__ = ["model_args", "megatron_entry", "moe_layer_freq", "megatron_model_unsupported"]


def model_args(
    model: ModelSpec, seq_len: int, dispatcher: MoeDispatcher = MoeDispatcher.ALLTOALL
) -> list[list[str]]:
    args = [
        ["--num-layers", str(model.num_layers)],
        ["--hidden-size", str(model.hidden_size)],
        ["--num-attention-heads", str(model.num_heads)],
        ["--ffn-hidden-size", str(model.ffn_hidden_size)],
        ["--seq-length", str(seq_len)],
        ["--max-position-embeddings", str(max(model.max_seq_len, seq_len))],
    ]
    if model.num_kv_heads != model.num_heads:
        args += [["--group-query-attention"], ["--num-query-groups", str(model.num_kv_heads)]]
    args += _ACTIVATION_FLAGS.get((model.gated_mlp, model.definition.activation), [])
    if model.learned_positions:
        args.append(["--position-embedding-type", "learned_absolute"])
    else:  # NemotronH's attention has no position embedding (MambaModel's default)
        args.append(["--position-embedding-type", "none" if model.layer_pattern else "rope"])
    args.append(["--normalization", "LayerNorm" if model.definition.norm.startswith("layer") else "RMSNorm"])
    if model.definition.norm.endswith("_1p"):  # TransformerConfig.layernorm_zero_centered_gamma
        args.append(["--apply-layernorm-1p"])
    if not model.bias:
        args.append(["--disable-bias-linear"])
        if model.attention_bias:  # Qwen2, GLM-4.5: bias on the QKV projection only
            args.append(["--add-qkv-bias"])
    if not model.tie_embeddings:
        args.append(["--untie-embeddings-and-output-weights"])
    if model.attention_head_dim and not model.uses_mla:
        args.append(["--kv-channels", str(model.attention_head_dim)])
    if model.mtp_layers:  # multi-token prediction (costmodel/mtp.py); its loss weight is the user's
        args.append(["--mtp-num-layers", str(model.mtp_layers)])
    if model.attention_output_gate:
        args.append(["--attention-output-gate"])
    args += _gdn_args(model) + _hybrid_args(model) + _mla_args(model) + _moe_args(model, dispatcher)
    return args + _definition_args(model)


_ACTIVATION_FLAGS = {
    (True, "silu"): [["--swiglu"]],
    (False, "gelu"): [],  # Megatron's default, F.gelu
    (False, "gelu_tanh"): [["--openai-gelu"]],  # GPT-2's tanh approximation
    (False, "relu2"): [["--squared-relu"]],  # Nemotron-4, NemotronH
}
"""(gated, activation) -> Megatron-LM core_v0.16.1's flags (``core_transformer_config_from_args``); the
others (GeGLU, ReLU, quick GELU without a gate) it has none for."""

MEGATRON_ROTARY_BASE = 10000
"""Megatron-LM's ``--rotary-base`` default (an ``int`` flag), and its ``--norm-epsilon`` default below."""
MEGATRON_NORM_EPS = 1e-5
MEGATRON_LLAMA3_SCALING = (1.0, 4.0, 8192)
"""The low / high frequency factors and original context of Megatron's ``--use-rope-scaling`` (megatron-core
``RotaryEmbedding._apply_scaling`` defaults; only ``--rope-scaling-factor`` is a flag): Llama 3.1's."""
MEGATRON_MLA_YARN = (4096, 32.0, 1.0)
"""The original context and YaRN betas of ``MLATransformerConfig`` (megatron-core 0.16.1), which Megatron-LM
core_v0.16.1 sets no flag for (only ``--rotary-scaling-factor``, ``--mscale``, ``--mscale-all-dim``)."""


def _uses_rope(model: ModelSpec) -> bool:
    """GPT's learned positions and a hybrid pattern's attention (position embedding ``none``) have no RoPE."""
    return not model.learned_positions and not model.layer_pattern


def _scaling_unsupported(model: ModelSpec) -> str | None:
    rope = model.definition.rope
    if model.uses_mla:
        if rope.scaling not in ("", "yarn"):
            return f"rope_scaling {rope.scaling} with MLA: Megatron's MLA scales RoPE with YaRN only"
        yarn = (rope.original_positions or MEGATRON_MLA_YARN[0], rope.beta_fast, rope.beta_slow)
        if rope.scaling and yarn != MEGATRON_MLA_YARN:
            return "YaRN's original context and betas: Megatron's MLA fixes them at 4096, 32 and 1"
        return None
    llama3 = (rope.low_freq_factor, rope.high_freq_factor, rope.original_positions)
    if rope.scaling == "llama3" and llama3 != MEGATRON_LLAMA3_SCALING:
        return "llama3 rope_scaling's frequency factors: Megatron fixes them at 1 and 4 over 8192 positions"
    if rope.scaling == "linear" and rope.factor != int(rope.factor):
        return f"linear rope_scaling {rope.factor:g}: Megatron's interpolation factor is an integer"
    if rope.scaling not in ("", "llama3", "linear"):
        return f"rope_scaling {rope.scaling}: Megatron-LM 0.16 has no flag for it outside MLA"
    return None


_QK_NORM_UNSUPPORTED = {
    "full": "Q/K norm over all heads: Megatron's --qk-layernorm norms each head",
    "l2": "Llama 4's Q/K L2 norm on its RoPE layers only: Megatron's --qk-l2-norm norms every layer",
}


def _layers_unsupported(model: ModelSpec) -> list[str]:
    """Block structure the flags cannot write: some local-attention layers among full ones (autotune keeps
    their count, not which they are, so no ``--window-attn-skip-freq``), Llama 4's chunks, Gemma's four
    norms per block with GeGLU (``--swiglu`` is SiLU-gated), gpt-oss's expert biases."""
    reasons = []
    local, layers = model.num_local_layers, model.num_layers
    if model.chunked_attention and local:
        reasons.append("chunked attention layers (Llama 4): Megatron-LM 0.16 has no flag for them")
    elif local and model.attention_window and local < layers:
        reasons.append(
            f"{local} sliding-window layers of {layers}: which ones is not kept for --window-attn-skip-freq"
        )
    if model.num_layer_norms == 4:
        reasons.append("Gemma's four norms per block and GeGLU: Megatron-LM 0.16 has no flags for them")
    if model.expert_bias:
        reasons.append("gpt-oss's expert and router biases: Megatron-LM 0.16 has no flag for them")
    if model.mtp_layers and model.mtp_pattern:
        depths = "/".join([model.mtp_pattern] * model.mtp_layers)
        reasons.append(
            f"multi-token prediction of a hybrid model ({model.mtp_layers} x {model.mtp_pattern}): "
            f"Megatron-LM 0.16's MambaModel has none (0.17: --hybrid-layer-pattern MAIN/{depths}"
            f"{' --mtp-use-repeated-layer' * model.mtp_shared})"
        )
    elif model.mtp_layers and model.mtp_shared:
        reasons.append("one MTP module run at every depth: Megatron-LM 0.16 has no --mtp-use-repeated-layer")
    return reasons


def megatron_model_unsupported(model: ModelSpec) -> list[str]:
    """What of ``model``'s definition Megatron-LM core_v0.16.1 has no flag for ([]: its flags build it): the
    blocks' structure, the MoE router, the activation, RoPE, the Q/K norm."""
    reasons = _layers_unsupported(model) + _router_unsupported(model)
    act = model.definition.activation
    if (model.gated_mlp, act) not in _ACTIVATION_FLAGS:
        kind = f"gated {act}" if model.gated_mlp else act
        reasons.append(f"a {kind} MLP: Megatron-LM 0.16 has SwiGLU, GELU (exact or tanh) and squared ReLU")
    theta = model.definition.rope.theta
    if _uses_rope(model) and theta != int(theta):
        reasons.append(f"rope_theta {theta:g}: Megatron's --rotary-base takes an integer")
    if _uses_rope(model) and (scaling := _scaling_unsupported(model)):
        reasons.append(scaling)
    if model.definition.qk_norm in _QK_NORM_UNSUPPORTED:
        reasons.append(_QK_NORM_UNSUPPORTED[model.definition.qk_norm])
    return reasons


def _definition_args(model: ModelSpec) -> list[list[str]]:
    """RoPE, the window, the Q/K norm and the norms' epsilon where they differ from Megatron's defaults."""
    unsupported = megatron_model_unsupported(model)
    if unsupported:
        raise ConfigError(f"{model.name}: {unsupported[0]}")
    definition, args = model.definition, []
    rope = definition.rope
    if _uses_rope(model):
        if rope.theta != MEGATRON_ROTARY_BASE:
            args.append(["--rotary-base", str(int(rope.theta))])
        if rope.fraction != 1.0 and not model.uses_mla:
            args.append(["--rotary-percent", f"{rope.fraction:g}"])
        if model.uses_mla and not rope.scaling:  # MLATransformerConfig's rope_type defaults to yarn
            args.append(["--rope-type", "rope"])
        elif model.uses_mla:
            args += [
                ["--rotary-scaling-factor", f"{rope.factor:g}"],
                ["--mscale", f"{rope.mscale:g}"],
                ["--mscale-all-dim", f"{rope.mscale_all_dim:g}"],
            ]
        elif rope.scaling == "llama3":
            args += [["--use-rope-scaling"], ["--rope-scaling-factor", f"{rope.factor:g}"]]
        elif rope.scaling == "linear":
            args.append(["--rotary-seq-len-interpolation-factor", str(int(rope.factor))])
    if model.num_local_layers == model.num_layers and model.attention_window:  # Mistral: every layer
        args.append(["--window-size", f"{model.attention_window - 1},0"])  # HF's window W is (W - 1, 0)
    if definition.qk_norm == "head":
        args.append(["--qk-layernorm"])
    if definition.norm_eps != MEGATRON_NORM_EPS:
        args.append(["--norm-epsilon", f"{definition.norm_eps:g}"])
    return args


MAMBA_STACK_SPEC = ["megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec"]
"""``--spec`` of a hybrid model (Megatron-LM ``mamba_builders.py`` raises without it)."""
MEGATRON_MAMBA_CONV = 4
"""The causal convolution width Megatron-Core's ``MambaMixer`` builds (``d_conv=4``; no flag sets it)."""


def _hybrid_args(model: ModelSpec) -> list[list[str]]:
    """A hybrid Mamba-2 model (``pretrain_mamba.py``): its pattern (``MambaStack``), the Mamba-2 heads, state
    and groups (megatron-core ``TransformerConfig`` ``mamba_*``) and the layer spec."""
    if not model.layer_pattern:
        return []
    if model.mamba_heads and model.mamba_conv_kernel != MEGATRON_MAMBA_CONV:
        raise ConfigError(
            f"{model.name}: Megatron-Core's Mamba-2 convolution is {MEGATRON_MAMBA_CONV} wide, the model's "
            f"{model.mamba_conv_kernel}"
        )
    args = [
        ["--is-hybrid-model"],
        ["--hybrid-override-pattern", model.layer_pattern],
        ["--spec", *MAMBA_STACK_SPEC],
    ]
    if model.mamba_heads:
        args += [
            ["--mamba-num-heads", str(model.mamba_heads)],
            ["--mamba-head-dim", str(model.mamba_head_dim)],
            ["--mamba-state-dim", str(model.mamba_state_dim)],
            ["--mamba-num-groups", str(model.mamba_groups)],
        ]
    return args


def megatron_entry(model: ModelSpec) -> str:
    """The Megatron-LM script that builds ``model``: ``pretrain_mamba.py`` for a hybrid pattern (its
    ``mamba_builder``), else ``pretrain_gpt.py``."""
    return "pretrain_mamba.py" if model.layer_pattern else "pretrain_gpt.py"


def _gdn_args(model: ModelSpec) -> list[list[str]]:
    """Gated DeltaNet layers (megatron-core ``TransformerConfig.experimental_attention_variant``
    ``gated_delta_net``): ``--linear-attention-freq N`` puts softmax attention on every N-th layer, as
    Qwen3-Next's ``full_attention_interval`` (``get_linear_attention_pattern``)."""
    linear, layers = model.num_linear_layers, model.num_layers
    if not linear:
        return []
    every = layers // (layers - linear) if linear < layers else 0
    if not every or layers - layers // every != linear:
        raise ConfigError(
            f"{model.name}: its {linear} Gated DeltaNet layers of {layers} do not leave softmax attention on "
            "every N-th layer; write Megatron's --linear-attention-freq as the per-layer list by hand"
        )
    return [
        ["--experimental-attention-variant", "gated_delta_net"],
        ["--linear-attention-freq", str(every)],
        ["--linear-conv-kernel-dim", str(model.linear_conv_kernel)],
        ["--linear-key-head-dim", str(model.linear_key_head_dim)],
        ["--linear-value-head-dim", str(model.linear_value_head_dim)],
        ["--linear-num-key-heads", str(model.linear_key_heads)],
        ["--linear-num-value-heads", str(model.linear_value_heads)],
    ]


def _mla_args(model: ModelSpec) -> list[list[str]]:
    if not model.uses_mla:
        return []
    args = [
        ["--multi-latent-attention"],
        ["--kv-lora-rank", str(model.kv_lora_rank)],
        ["--qk-head-dim", str(model.qk_nope_head_dim)],
        ["--qk-pos-emb-head-dim", str(model.qk_rope_head_dim)],
        ["--v-head-dim", str(model.v_head_dim)],
    ]
    if model.q_lora_rank:
        args.append(["--q-lora-rank", str(model.q_lora_rank)])
    return args


def moe_layer_freq(model: ModelSpec) -> str:
    """``--moe-layer-freq`` as Megatron evaluates it (``megatron/training/arguments.py`` ``moe_freq_type``): 1
    when every layer is MoE, else a run-length list expression such as ``[0]*3+[1]*58``."""
    flags = [int(i in set(model.moe_layers)) for i in range(model.num_layers)]
    if all(flags):
        return "1"
    runs: list[list[int]] = []
    for f in flags:
        if runs and runs[-1][0] == f:
            runs[-1][1] += 1
        else:
            runs.append([f, 1])
    return "+".join(f"[{f}]*{n}" for f, n in runs)


def _moe_args(model: ModelSpec, dispatcher: MoeDispatcher) -> list[list[str]]:
    if not model.is_moe:
        return []
    args = [
        ["--num-experts", str(model.num_experts)],
        ["--moe-router-topk", str(model.experts_per_token)],
        ["--moe-ffn-hidden-size", str(model.expert_ffn_hidden_size)],
        ["--moe-grouped-gemm"],
    ]
    if not model.layer_pattern:  # a hybrid pattern places its MoE layers itself (its E characters)
        args.insert(3, ["--moe-layer-freq", moe_layer_freq(model)])
    if dispatcher in (MoeDispatcher.ALLTOALL, MoeDispatcher.ALLGATHER):
        args.append(["--moe-token-dispatcher-type", str(dispatcher)])
    else:  # megatron/core/transformer/moe/token_dispatcher.py MoEFlexTokenDispatcher
        args += [["--moe-token-dispatcher-type", "flex"], ["--moe-flex-dispatcher-backend", str(dispatcher)]]
    if model.shared_ffn_hidden_size:
        args.append(["--moe-shared-expert-intermediate-size", str(model.shared_ffn_hidden_size)])
    if model.moe_latent_size:  # TransformerConfig.moe_latent_size (megatron-core moe_layer.py)
        args.append(["--moe-latent-size", str(model.moe_latent_size)])
    return args + _router_args(model)


def _router_args(model: ModelSpec) -> list[list[str]]:
    """The router as Megatron-Core's ``topk_routing_with_score_function`` computes it (megatron-core 0.16.1
    ``moe_utils.py``): softmax over the chosen logits by default, or over all (``--moe-router-pre-softmax``),
    or sigmoid scores renormalised; a scaling factor, group-limited choice, an expert bias."""
    r, args = model.definition.router, []
    if r.score == "sigmoid":
        args.append(["--moe-router-score-function", "sigmoid"])
    if r.pre_softmax:
        args.append(["--moe-router-pre-softmax"])
    if r.scale != 1.0:
        args.append(["--moe-router-topk-scaling-factor", f"{r.scale:g}"])
    if r.groups:
        args += [["--moe-router-num-groups", str(r.groups)], ["--moe-router-group-topk", str(r.group_topk)]]
    if r.expert_bias:
        args.append(["--moe-router-enable-expert-bias"])
    if r.shared_gate:
        args.append(["--moe-shared-expert-gate"])
    return args


def _router_unsupported(model: ModelSpec) -> list[str]:
    r = model.definition.router
    if not model.is_moe:
        return []
    if r.kind != "topk":
        return [f"its {r.kind} router: Megatron-Core routes by top-k scores"]
    if r.score not in ("softmax", "sigmoid"):
        return [f"scoring_func {r.score}: Megatron-Core scores experts by softmax or sigmoid"]
    reasons = []
    if r.score == "sigmoid" and not r.normalized and model.experts_per_token > 1:
        reasons.append("sigmoid routing without renormalisation: Megatron-Core renormalises the top-k")
    if r.expert_bias and r.score != "sigmoid":
        reasons.append("an expert bias on softmax scores: Megatron-Core adds it to sigmoid scores only")
    return reasons
