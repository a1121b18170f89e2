"""What a model's config says that defines the model but costs a step nothing: rotary position embeddings
(the base, the share of each head they rotate, the long-context scaling), the norm on queries and keys, the
norms' epsilon. A few elementwise operations fused into kernels autotune prices already; they are read so
that the Megatron emitter (``emit/megatronmodel.py``) writes arguments that build the model the config
describes.

RoPE is read from Hugging Face keys: ``rope_theta`` (GPT-NeoX ``rotary_emb_base``; transformers 5's
``rope_parameters``), ``partial_rotary_factor`` (GPT-NeoX ``rotary_pct``; MiniMax ``rotary_dim``) and
``rope_scaling`` (``rope_type`` or ``type``: ``llama3`` with its frequency factors, ``yarn`` with its betas
and mscales, ``linear``, ``dynamic``, ``longrope``, ...), with transformers' defaults
(``transformers/modeling_rope_utils.py``) where a key is absent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from autotune.errors import ConfigError

__all__ = ["Rope", "read_rope", "definition_fields"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Rope:
    """RoPE of a model (Su et al. 2021); the defaults are Llama 2's: base 10,000, whole heads, no scaling."""

    theta: float = 10000.0
    fraction: float = 1.0
    """Share of each head's width that is rotated (Nemotron-4 0.5, Qwen3-Next 0.25)."""
    scaling: str = ""
    """The config's ``rope_type`` for long context: ``llama3``, ``yarn``, ``linear``, ... ("": none)."""
    factor: float = 1.0
    original_positions: int = 0
    """The context the scaling stretches (``original_max_position_embeddings``; 0: not given)."""
    low_freq_factor: float = 1.0
    """``llama3`` scaling (Llama 3.1: 1 and 4 over 8,192 original positions)."""
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    """``yarn`` (Peng et al. 2023): the correction range and the attention temperature's mscales."""
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0


def _number(value: Any, key: str, where: str, *, positive: bool = True) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (positive and value <= 0):
        kind = "a positive number" if positive else "a number"
        raise ConfigError(f"{where}: key '{key}' must be {kind}, got {value!r}")
    return float(value)


def _fraction(cfg: dict[str, Any], where: str) -> float:
    if cfg.get("partial_rotary_factor") is not None:
        key, value = "partial_rotary_factor", cfg["partial_rotary_factor"]
    elif cfg.get("rotary_pct") is not None:
        key, value = "rotary_pct", cfg["rotary_pct"]
    elif cfg.get("rotary_dim") is not None and cfg.get("head_dim"):
        key, value = "rotary_dim", _number(cfg["rotary_dim"], "rotary_dim", where) / float(cfg["head_dim"])
    else:
        return 1.0
    fraction = _number(value, key, where)
    if fraction > 1.0:
        raise ConfigError(f"{where}: key '{key}' rotates {fraction:g} of each head; it must be in (0, 1]")
    return fraction


_SCALING_KEYS = {
    "factor": "factor",
    "original_max_position_embeddings": "original_positions",
    "low_freq_factor": "low_freq_factor",
    "high_freq_factor": "high_freq_factor",
    "beta_fast": "beta_fast",
    "beta_slow": "beta_slow",
    "mscale": "mscale",
    "mscale_all_dim": "mscale_all_dim",
}


def _scaling(params: dict[str, Any], where: str) -> dict[str, Any]:
    kind = str(params.get("rope_type", params.get("type", "default")) or "default")
    if kind == "default":
        return {}
    out: dict[str, Any] = {"scaling": kind}
    for key, field in _SCALING_KEYS.items():
        if params.get(key) is not None:
            value = _number(params[key], f"rope_scaling.{key}", where, positive=key != "mscale_all_dim")
            out[field] = int(value) if field == "original_positions" else value
    return out


def read_rope(cfg: dict[str, Any], where: str) -> Rope:
    """The ``Rope`` a config describes; a malformed value is a one-line ``ConfigError`` naming its key."""
    params = cfg.get("rope_parameters")
    params = params if isinstance(params, dict) else {}
    scaling = cfg.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise ConfigError(f"{where}: key 'rope_scaling' must be a mapping or null, got {scaling!r}")
    theta_key = next((k for k in ("rope_theta", "rotary_emb_base") if cfg.get(k) is not None), None)
    theta = cfg[theta_key] if theta_key else params.get("rope_theta", 10000.0)
    return Rope(
        theta=_number(theta, theta_key or "rope_parameters.rope_theta", where),
        fraction=_fraction(cfg, where),
        **_scaling(scaling if scaling is not None else params, where),
    )


_QK_NORM_TYPES = {
    **dict.fromkeys(("gemma3", "gemma3_text"), "head"),
    **dict.fromkeys(("olmo2", "olmo3", "olmoe"), "full"),
}
"""Model types whose attention norms Q and K without a config key saying so: per head (``q_norm`` of
``head_dim``) or over all heads (of ``heads x head_dim``), as their transformers modules build it; and every
Qwen3 type (``qwen3``, ``qwen3_moe``, ``qwen3_next``, ``qwen3_5*``), per head."""
_EPS_KEYS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps", "norm_epsilon")


def _qk_norm(cfg: dict[str, Any]) -> str:
    kind = str(cfg.get("model_type", ""))
    if cfg.get("qk_norm_type") is not None:  # MiniMax: per_layer (over all heads) or per_head
        return "full" if cfg["qk_norm_type"] == "per_layer" else "head"
    if cfg.get("use_qk_norm"):  # Llama 4: a weightless L2 norm; GLM-4.5, Cohere, Hunyuan: per head
        return "l2" if kind.startswith("llama4") else "head"
    return "head" if kind.startswith("qwen3") else _QK_NORM_TYPES.get(kind, "")


def definition_fields(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """What defines the model without changing a step's cost: RoPE, the Q/K norm, the norms' epsilon."""
    fields: dict[str, Any] = {}
    rope = read_rope(cfg, where)
    if rope != Rope():
        fields["rope"] = rope
    if qk := _qk_norm(cfg):
        fields["qk_norm"] = qk
    key = next((k for k in _EPS_KEYS if cfg.get(k) is not None), None)
    if key is not None:
        eps = cfg[key]
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 < eps < 1:
            raise ConfigError(f"{where}: key '{key}' must be a number in (0, 1), got {eps!r}")
        fields["norm_eps"] = float(eps)
    return fields
