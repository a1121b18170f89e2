"""Architectures autotune does not price, recognised by the config keys that define them, so a user reads
what is missing instead of being told to delete keys one by one (which would plan the wrong model).

Token mixers other than softmax attention, Gated DeltaNet and Nemotron-H's Mamba-2 layers (which
``modelshape`` prices) change a layer's parameters, FLOPs, saved activations and kernels: other Mamba
hybrids (Jamba: ``attn_layer_period``; Falcon-H1: ``mamba_d_ssm``), Kimi Linear's delta attention
(``linear_attn_config``), MiniMax's lightning attention (``attn_type_list`` / ``decoder_attention_types``
entries 0) and DeepSeek-V3.2's sparse-attention indexer (``index_topk``).
"""

from __future__ import annotations

from typing import Any

from autotune.errors import ConfigError

__all__ = ["ATTENTION_LAYER_TYPES", "refuse_unpriced_architecture"]

_PLANS = "(it plans softmax-attention, Gated DeltaNet and Nemotron-H-style Mamba-2 models, dense or MoE)"
_MAMBA = "Mamba-2 state-space layers of another hybrid (Jamba, Falcon-H1)"
_MARKERS: dict[str, str] = {
    **dict.fromkeys(("mamba_d_state", "mamba_d_ssm", "attn_layer_period"), _MAMBA),
    "linear_attn_config": "Kimi Delta Attention layers (Kimi Linear)",
    "index_topk": "DeepSeek Sparse Attention's indexer (DeepSeek-V3.2)",
}
"""A key that only these architectures' configs carry -> what it defines."""

ATTENTION_LAYER_TYPES = frozenset(
    {"full_attention", "sliding_attention", "chunked_attention", "linear_attention"}
)
"""``layer_types`` entries autotune prices (gpt-oss, Gemma 3, Llama 4; Qwen3.5's Gated DeltaNet layers);
others name another token mixer."""


def refuse_unpriced_architecture(cfg: dict[str, Any], where: str) -> None:
    """One line naming the architecture a config defines and autotune does not price, if it does."""
    for key, what in _MARKERS.items():
        if key in cfg:
            raise ConfigError(f"{where}: key '{key}' defines {what}, which autotune does not price {_PLANS}")

    for key in ("attn_type_list", "decoder_attention_types"):  # MiniMax: 1 softmax, 0 lightning attention
        if isinstance(cfg.get(key), list) and 0 in cfg[key]:
            raise ConfigError(
                f"{where}: key '{key}' lists lightning (linear) attention layers (MiniMax-Text-01, "
                f"MiniMax-M1), which autotune does not price {_PLANS}"
            )
    types = cfg.get("layer_types")
    if isinstance(types, list):
        other = sorted({str(t) for t in types} - ATTENTION_LAYER_TYPES)
        if other:
            raise ConfigError(
                f"{where}: key 'layer_types' lists layers of type {', '.join(other)}, which autotune does "
                f"not price {_PLANS}"
            )
