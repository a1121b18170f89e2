"""Hugging Face ``config.json`` keys beyond the dense core: Mixture-of-Experts, MLA, explicit head widths,
local attention, and the rule that every key is priced, known not to change the cost, or refused
(the key tables: ``autotune.modelkeys``).

Key names and their meaning are those of transformers' ``configuration_*.py`` and the published config.json
files: Mixtral (``num_local_experts``), Qwen2-MoE / Qwen3-MoE (``num_experts``, ``moe_intermediate_size``,
``shared_expert_intermediate_size``, ``decoder_sparse_step``, ``mlp_only_layers``: layer ``i`` is MoE when it
is not in ``mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0``), DeepSeek-V2/V3
(``n_routed_experts``, ``n_shared_experts`` of ``moe_intermediate_size`` each, ``first_k_dense_replace``,
``moe_layer_freq``: MoE when ``i >= first_k_dense_replace`` and ``i % moe_layer_freq == 0``; MLA ranks),
Llama 4 text (``interleave_moe_layer_step``: MoE layers ``step-1, 2 step-1, ...``; one shared expert of
``intermediate_size``, dense layers of ``intermediate_size_mlp``; chunked attention on the RoPE layers),
gpt-oss (experts with biases, ``layer_types``), ERNIE 4.5 (``moe_num_experts``, ``moe_k``,
``moe_num_shared_experts`` of ``moe_intermediate_size`` each; MoE when ``moe_layer_start_index <= i <=
moe_layer_end_index`` and ``(i + 1) % moe_layer_interval == 0``, transformers ``Ernie4_5_MoeDecoderLayer``),
Gemma 2 (GeGLU, 4 norms per block, sliding window on even layers), NemotronH (Nemotron-H, Nemotron 3:
``hybrid_override_pattern`` or ``layers_block_type``, one sub-layer per layer; ``mamba_num_heads``,
``mamba_head_dim``, ``ssm_state_size``, ``n_groups``, ``conv_kernel``;
``moe_shared_expert_intermediate_size``; ``moe_latent_size``, LatentMoE; ``mlp_hidden_act`` relu2).
"""

from __future__ import annotations

from typing import Any

from autotune.definition import Definition, read_definition
from autotune.errors import ConfigError
from autotune.modelkeys import NEUTRAL_KEYS, PRICED_KEYS
from autotune.modelrefusals import refuse_unpriced_architecture
from autotune.modelshape import MAMBA_CHUNK

__all__ = ["check_keys", "arch_fields", "is_gemma"]


_DROPOUT = ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop")


def is_gemma(cfg: dict[str, Any]) -> bool:
    """Gemma's MLP is gated whatever its activation is called (transformers ``GemmaMLP``:
    ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``, GeGLU with ``gelu_pytorch_tanh``)."""
    return str(cfg.get("model_type", "")).startswith("gemma")


def check_keys(cfg: dict[str, Any], where: str) -> None:
    """Refuse a key autotune does not know, or a value of a known key it cannot price (one line each)."""
    refuse_unpriced_architecture(cfg, where)
    for key in cfg:
        if key not in PRICED_KEYS and key not in NEUTRAL_KEYS:
            raise ConfigError(
                f"{where}: key '{key}' is not one autotune prices; if it changes the model's "
                "shape or compute it cannot be planned here, else remove it"
            )
    if "vision_config" in cfg or "text_config" in cfg:
        raise ConfigError(
            f"{where}: key '{'vision_config' if 'vision_config' in cfg else 'text_config'}': "
            "multimodal configs are not priced; pass the text model's own config "
            "(e.g. its text_config, model_type llama4_text)"
        )
    for key in _DROPOUT:
        if cfg.get(key) not in (None, 0, 0.0):
            raise ConfigError(
                f"{where}: key '{key}' = {cfg[key]!r}: dropout masks are not priced "
                "(activations.DROPOUT is off); set it to 0"
            )
    if cfg.get("use_mtp") and cfg.get("mtp_transformer_layers", 1) != 1:
        raise ConfigError(
            f"{where}: key 'mtp_transformer_layers' must be 1 (one block per MTP module is priced)"
        )
    for key in ("mlp_bias", "use_bias", "mamba_proj_bias"):  # ERNIE's use_bias: a bias on every projection
        if cfg.get(key):
            raise ConfigError(f"{where}: key '{key}' = true is not priced; set it to false")
    _check_hybrid_keys(cfg, where)


_PATTERN_KINDS = {
    "mamba": "M",
    "linear_attention": "M",
    "attention": "*",
    "full_attention": "*",
    "mlp": "-",
    "moe": "E",
}
"""``layers_block_type`` entries -> ``hybrid_override_pattern`` characters (transformers NemotronH; 5.x names
Mamba-2 ``linear_attention`` and attention ``full_attention``, ``_LEGACY_LAYER_TYPE_REMAP``)."""
MTP_DEFAULT_PATTERN = "*E"
"""transformers ``NemotronHConfig``'s ``mtp_layers_block_type`` default, ``["full_attention", "moe"]``: a
saved config leaves it out when it is the default."""


_HYBRID_MTP_KEYS = ("mtp_hybrid_override_pattern", "mtp_layers_block_type", "mtp_use_repeated_layer")


def _check_hybrid_keys(cfg: dict[str, Any], where: str) -> None:
    """NemotronH values the Mamba-2 pricing does not cover (``modelshape``'s Megatron layer)."""
    if cfg.get("use_conv_bias") is False:
        raise ConfigError(
            f"{where}: key 'use_conv_bias' = false is not priced (Megatron's conv1d has a bias)"
        )
    if not _pattern(cfg, where):
        for key in _HYBRID_MTP_KEYS:
            if cfg.get(key) is not None:
                raise ConfigError(
                    f"{where}: key '{key}' is priced for hybrid (NemotronH) models only; remove it"
                )
        return
    if cfg.get("chunk_size", MAMBA_CHUNK) != MAMBA_CHUNK:
        raise ConfigError(f"{where}: key 'chunk_size' must be {MAMBA_CHUNK}, the SSD chunk autotune prices")
    if not isinstance(cfg.get("mtp_use_repeated_layer", True), bool):
        raise ConfigError(f"{where}: key 'mtp_use_repeated_layer' must be true or false")


def _pattern(
    cfg: dict[str, Any], where: str, key: str = "hybrid_override_pattern", kinds_key: str = ""
) -> str:
    """The hybrid layer pattern of a NemotronH config ("" for other models), checked; ``key`` /
    ``kinds_key``: the MTP block's (``mtp_hybrid_override_pattern`` / ``mtp_layers_block_type``)."""
    pattern = cfg.get(key)
    kinds_key = kinds_key or "layers_block_type"
    kinds = cfg.get(kinds_key)
    if pattern is None and kinds is not None:
        if not isinstance(kinds, list) or any(k not in _PATTERN_KINDS for k in kinds):
            raise ConfigError(f"{where}: key '{kinds_key}' entries must be one of {sorted(_PATTERN_KINDS)}")
        pattern = "".join(_PATTERN_KINDS[k] for k in kinds)
    if pattern is None:
        return ""
    if not isinstance(pattern, str) or not pattern or set(pattern) - set("M*-E"):
        raise ConfigError(
            f"{where}: key '{key}' must be a string of M (Mamba-2), * (attention), - (MLP) and E (MoE)"
        )
    return pattern


def _hybrid_mtp(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """A NemotronH config's MTP block, as Megatron-Bridge's ``NemotronHBridge`` reads it
    (``num_nextn_predict_layers`` depths of ``mtp_hybrid_override_pattern``, ``mtp_use_repeated_layer``
    default true: one module run at every depth), or transformers' ``mtp_layers_block_type``."""
    if not _int(cfg, "num_nextn_predict_layers", where):
        return {}
    pattern = _pattern(cfg, where, "mtp_hybrid_override_pattern", "mtp_layers_block_type")
    pattern = pattern or MTP_DEFAULT_PATTERN
    if "E" in pattern and not _num_experts(cfg, where):
        raise ConfigError(
            f"{where}: the MTP block '{pattern}' has an MoE layer (E) but the model has no experts; set key "
            "'mtp_hybrid_override_pattern' to its layers (e.g. '*-')"
        )
    return {"mtp_pattern": pattern, "mtp_shared": cfg.get("mtp_use_repeated_layer", True)}


def _int(cfg: dict[str, Any], key: str, where: str, default: int = 0) -> int:
    value = cfg.get(key, default)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where}: key '{key}' must be a non-negative integer, got {value!r}")
    return value


def _index_list(cfg: dict[str, Any], key: str, where: str, num_layers: int) -> list[int] | None:
    value = cfg.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or any(
        isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_layers for i in value
    ):
        raise ConfigError(f"{where}: key '{key}' must be a list of layer indices 0..{num_layers - 1}")
    return value


def _moe_layers(cfg: dict[str, Any], where: str, num_layers: int) -> tuple[int, ...]:
    """Which layers are MoE, by each family's rule (module docstring)."""
    pattern = _pattern(cfg, where)
    if pattern:
        return tuple(i for i, c in enumerate(pattern) if c == "E")
    explicit = _index_list(cfg, "moe_layers", where, num_layers)
    if explicit is not None:
        return tuple(sorted(set(explicit)))
    if "interleave_moe_layer_step" in cfg:
        step = max(1, _int(cfg, "interleave_moe_layer_step", where, 1))
        return tuple(range(step - 1, num_layers, step))
    if "moe_layer_start_index" in cfg or "moe_layer_interval" in cfg:  # ERNIE 4.5, end -1: the last layer
        start, step = (
            _int(cfg, "moe_layer_start_index", where),
            max(1, _int(cfg, "moe_layer_interval", where, 1)),
        )
        end = cfg.get("moe_layer_end_index", -1)
        end = num_layers - 1 if end in (-1, None) else _int(cfg, "moe_layer_end_index", where)
        return tuple(i for i in range(num_layers) if start <= i <= end and (i + 1) % step == 0)
    if "n_routed_experts" in cfg:
        first, freq = _int(cfg, "first_k_dense_replace", where), max(1, _int(cfg, "moe_layer_freq", where, 1))
        return tuple(i for i in range(num_layers) if i >= first and i % freq == 0)
    step = max(1, _int(cfg, "decoder_sparse_step", where, 1))
    dense = set(_index_list(cfg, "mlp_only_layers", where, num_layers) or [])
    return tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0)


def _num_experts(cfg: dict[str, Any], where: str) -> int:
    """Routed experts per MoE layer, under each family's key (0: a dense model)."""
    return (
        _int(cfg, "num_local_experts", where)
        or _int(cfg, "num_experts", where)
        or _int(cfg, "n_routed_experts", where)
        or _int(cfg, "moe_num_experts", where)
    )


def _moe_fields(cfg: dict[str, Any], where: str, num_layers: int) -> dict[str, Any]:
    num = _num_experts(cfg, where)
    if not num:
        return {}
    top_k = (
        _int(cfg, "num_experts_per_tok", where)
        or _int(cfg, "experts_per_token", where)
        or _int(cfg, "moe_k", where)
    )
    if not 0 < top_k <= num:
        raise ConfigError(f"{where}: key 'num_experts_per_tok' must be in 1..{num} (the routed experts)")
    expert_ffn = _int(cfg, "moe_intermediate_size", where) or _int(cfg, "intermediate_size", where)
    if not expert_ffn:
        raise ConfigError(f"{where}: missing key 'moe_intermediate_size' (the width of one expert)")
    shared = (
        _int(cfg, "shared_expert_intermediate_size", where)
        or _int(cfg, "moe_shared_expert_intermediate_size", where)
        or (_int(cfg, "n_shared_experts", where) or _int(cfg, "moe_num_shared_experts", where)) * expert_ffn
        or _int(cfg, "shared_intermediate_size", where)
    )
    if str(cfg.get("model_type")) == "llama4_text":  # one shared expert as wide as a routed one
        shared = expert_ffn
    layers = _moe_layers(cfg, where, num_layers)
    if not layers and _pattern(cfg, where):
        raise ConfigError(f"{where}: the expert keys need MoE layers (E) in the hybrid pattern")
    if not layers:
        raise ConfigError(
            f"{where}: the expert keys leave no MoE layer; check 'decoder_sparse_step', "
            "'first_k_dense_replace', 'mlp_only_layers'"
        )
    return {
        "num_experts": num,
        "experts_per_token": top_k,
        "expert_ffn_hidden_size": expert_ffn,
        "shared_ffn_hidden_size": shared,
        "moe_layers": layers,
        "expert_bias": str(cfg.get("model_type")) == "gpt_oss",
        "moe_latent_size": _int(cfg, "moe_latent_size", where),  # LatentMoE (Nemotron 3 Super / Ultra)
    }


def _mla_fields(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    if not cfg.get("kv_lora_rank"):
        return {}
    fields = {
        k: _int(cfg, k, where)
        for k in ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
    }
    for k in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
        if not fields[k]:
            raise ConfigError(f"{where}: MLA (kv_lora_rank) needs key '{k}' > 0")
    return fields


def _local_layers(cfg: dict[str, Any], where: str, num_layers: int) -> dict[str, Any]:
    """Layers with a sliding window or chunks and the window's length (module docstring per family)."""
    kind = str(cfg.get("model_type", ""))
    if kind == "llama4_text" and cfg.get("attention_chunk_size"):
        rope = cfg.get("no_rope_layers")
        local = sum(bool(x) for x in rope) if isinstance(rope, list) else num_layers - num_layers // 4
        return {
            "attention_window": _int(cfg, "attention_chunk_size", where),
            "num_local_layers": local,
            "chunked_attention": True,
        }
    window = _int(cfg, "sliding_window", where)
    if not window or cfg.get("use_sliding_window") is False:
        return {}
    types = cfg.get("layer_types")
    if isinstance(types, list):
        local = sum(t == "sliding_attention" for t in types)
    elif kind == "gemma2":  # even layers slide (transformers Gemma2DecoderLayer: ``not bool(layer_idx % 2)``)
        local = (num_layers + 1) // 2
    elif kind == "gpt_oss":  # transformers GptOssConfig default layer_types: sliding on even layers
        local = (num_layers + 1) // 2
    elif "sliding_window_pattern" in cfg:  # Gemma 3: every pattern-th layer is global
        pattern = max(1, _int(cfg, "sliding_window_pattern", where, 1))
        local = num_layers - num_layers // pattern
    elif cfg.get("use_sliding_window"):  # Qwen2/3: layers from max_window_layers on use the window
        local = num_layers - min(num_layers, _int(cfg, "max_window_layers", where, num_layers))
    else:  # Mistral, Mixtral: every layer
        local = num_layers
    return {"attention_window": window, "num_local_layers": local} if local else {}


def _linear_fields(cfg: dict[str, Any], where: str, num_layers: int) -> dict[str, Any]:
    """Gated DeltaNet layers (transformers ``Qwen3NextConfig``: layer ``i`` is softmax attention when
    ``(i + 1) % full_attention_interval == 0``, else linear; Qwen3.5 lists ``layer_types``) and their heads;
    Qwen3-Next's softmax layers always gate their output, Qwen3.5's when ``attn_output_gate``."""
    types = cfg.get("layer_types")
    if isinstance(types, list):
        linear = sum(t == "linear_attention" for t in types)
    elif "full_attention_interval" in cfg:
        every = max(1, _int(cfg, "full_attention_interval", where, 1))
        linear = num_layers - num_layers // every
    else:
        linear = 0
    gate = bool(cfg.get("attn_output_gate", str(cfg.get("model_type", "")).startswith("qwen3_next")))
    if not linear:
        return {"attention_output_gate": True} if gate else {}
    heads = _positive_ints(
        cfg,
        where,
        "Gated DeltaNet layers",
        (
            ("linear_key_heads", "linear_num_key_heads"),
            ("linear_value_heads", "linear_num_value_heads"),
            ("linear_key_head_dim", "linear_key_head_dim"),
            ("linear_value_head_dim", "linear_value_head_dim"),
        ),
    )
    _check_multiple(
        where,
        heads,
        ("linear_value_heads", "linear_num_value_heads"),
        ("linear_key_heads", "linear_num_key_heads"),
    )
    conv = _int(cfg, "linear_conv_kernel_dim", where) or 4
    return {**heads, "num_linear_layers": linear, "linear_conv_kernel": conv, "attention_output_gate": gate}


def _hybrid_fields(cfg: dict[str, Any], where: str, num_layers: int) -> dict[str, Any]:
    """A NemotronH pattern and its Mamba-2 heads (module docstring); every layer has one pre-norm."""
    pattern = _pattern(cfg, where)
    if not pattern:
        return {}
    if len(pattern) != num_layers:
        raise ConfigError(
            f"{where}: the hybrid pattern has {len(pattern)} layers but 'num_hidden_layers' is {num_layers}"
        )
    if "E" in pattern and not _num_experts(cfg, where):
        raise ConfigError(f"{where}: the hybrid pattern has MoE layers (E) but no key 'n_routed_experts'")
    fields: dict[str, Any] = {"layer_pattern": pattern, "num_layer_norms": 1, **_hybrid_mtp(cfg, where)}
    if "M" not in pattern + fields.get("mtp_pattern", ""):
        return fields
    mamba = _positive_ints(
        cfg,
        where,
        "Mamba-2 layers (M)",
        (
            ("mamba_heads", "mamba_num_heads"),
            ("mamba_head_dim", "mamba_head_dim"),
            ("mamba_state_dim", "ssm_state_size"),
            ("mamba_groups", "n_groups"),
            ("mamba_conv_kernel", "conv_kernel"),
        ),
    )
    _check_multiple(where, mamba, ("mamba_heads", "mamba_num_heads"), ("mamba_groups", "n_groups"))
    return {**fields, **mamba}


def _positive_ints(
    cfg: dict[str, Any], where: str, what: str, fields_keys: tuple[tuple[str, str], ...]
) -> dict[str, int]:
    """``ModelSpec`` field -> the config key's value, each required > 0 for ``what``."""
    out: dict[str, int] = {}
    for field, key in fields_keys:
        out[field] = _int(cfg, key, where)
        if not out[field]:
            raise ConfigError(f"{where}: {what} need key '{key}' > 0")
    return out


def _check_multiple(where: str, fields: dict[str, int], many: tuple[str, str], few: tuple[str, str]) -> None:
    """``many``'s value must be a multiple of ``few``'s (each a field and its config key)."""
    if fields[many[0]] % fields[few[0]]:
        raise ConfigError(
            f"{where}: '{many[1]}' {fields[many[0]]} is not a multiple of '{few[1]}' {fields[few[0]]}"
        )


def arch_fields(cfg: dict[str, Any], where: str, num_layers: int) -> dict[str, Any]:
    """``ModelSpec`` keyword arguments beyond the dense core, read from ``cfg`` (keys already checked)."""
    fields: dict[str, Any] = {
        **_moe_fields(cfg, where, num_layers),
        **_mla_fields(cfg, where),
        **_local_layers(cfg, where, num_layers),
        **_linear_fields(cfg, where, num_layers),
        **_hybrid_fields(cfg, where, num_layers),
    }
    head_dim = _int(cfg, "head_dim", where)
    if head_dim and head_dim * _int(cfg, "num_attention_heads", where) != cfg["hidden_size"]:
        fields["attention_head_dim"] = head_dim
    if cfg.get("attention_bias") or str(cfg.get("model_type")) in ("qwen2", "qwen2_moe"):
        fields["attention_bias"] = cfg.get("attention_bias", True) is not False
    if str(cfg.get("model_type", "")) in ("gemma2", "gemma3_text"):
        fields["num_layer_norms"] = 4
    mtp = (
        _int(cfg, "num_nextn_predict_layers", where)
        or _int(cfg, "mtp_num_hidden_layers", where)
        or (_int(cfg, "num_mtp_modules", where) if cfg.get("use_mtp") else 0)
    )
    if mtp:
        fields["mtp_layers"] = mtp
    definition = read_definition(cfg, where, moe=bool(fields.get("num_experts")))
    return fields | ({"definition": definition} if definition != Definition() else {})
