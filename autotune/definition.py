"""What a model's config says that defines the model but costs a step nothing: rotary position embeddings
(the base, the share of each head they rotate, the long-context scaling), the norm on queries and keys, the
norms' kind and epsilon, the MLP's activation, how an MoE router weighs its experts. A few elementwise
operations inside kernels autotune prices already; they are read so that the Megatron emitter
(``emit/megatronmodel.py``) writes arguments that build the model the config describes.

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

__all__ = ["Definition", "Rope", "Router", "read_rope", "read_definition"]


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


@dataclass(frozen=True, kw_only=True, slots=True)
class Router:
    """How an MoE layer turns router logits into the weights of its top-k experts (which experts, not how
    many: the cost is the same). The defaults are Mixtral's: softmax over the chosen experts' logits."""

    kind: str = "topk"
    """``topk``, or a router Megatron-Core has no form of: ``sparsemixer`` (PhiMoE), ``llama4``."""
    score: str = "softmax"
    """``softmax`` or ``sigmoid`` (DeepSeek-V3, GLM-4.5, Nemotron-H): ``scoring_func``."""
    pre_softmax: bool = False
    """Softmax over every expert before the top-k, not renormalised (``norm_topk_prob: false``)."""
    normalized: bool = True
    """The chosen weights sum to one (``norm_topk_prob``)."""
    scale: float = 1.0
    """``routed_scaling_factor`` on the chosen weights (DeepSeek-V3 2.5)."""
    groups: int = 0
    """Group-limited routing: ``n_group`` groups of experts, the best ``topk_group`` of them (0: none)."""
    group_topk: int = 0
    expert_bias: bool = False
    """A per-expert bias on the scores that pick the experts, for balance without an auxiliary loss
    (``e_score_correction_bias``: DeepSeek-V3's ``noaux_tc``, GLM-4.5, Nemotron-H, MiniMax-M2)."""
    shared_gate: bool = False
    """The shared expert's output scaled by a sigmoid of ``h x 1`` (``shared_expert_gate``: Qwen2-MoE,
    Qwen3-Next, Qwen3.5)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Definition:
    """What defines a model beyond the shape the cost model prices (the defaults are Llama's)."""

    rope: Rope = Rope()
    qk_norm: str = ""
    """Q/K norm: ``head`` (per-head RMSNorm, Qwen3), ``full`` (over all heads, OLMo 2), ``l2`` (Llama 4)."""
    norm: str = "rms_norm"
    """``rms_norm``, ``layer_norm``, or either with its weight centred on zero (``_1p``: Gemma, Nemotron)."""
    norm_eps: float = 1e-5
    activation: str = "silu"
    """The MLP's activation: ``silu``, ``gelu``, ``gelu_tanh``, ``relu2``, ``relu``, ``quick_gelu``."""
    router: Router = Router()

    def __post_init__(self) -> None:
        if isinstance(self.rope, dict):  # JSON round trips (trial.json, a study's setup)
            object.__setattr__(self, "rope", Rope(**self.rope))
        if isinstance(self.router, dict):
            object.__setattr__(self, "router", Router(**self.router))


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


_NORM_TYPES = ("rms_norm", "layer_norm", "rms_norm_1p", "layer_norm_1p")
"""``norm_type`` values (StarCoder2's key; ``_1p``: the weight stored centred on zero, ``(1 + w)``)."""
_LAYER_NORM_TYPES = frozenset(
    {"gpt2", "gpt_bigcode", "gpt_neox", "gptj", "opt", "bloom", "falcon", "starcoder2", "phi", "stablelm"}
    | {"mpt", "cohere", "cohere2"}
)
_ACTIVATIONS = {
    **dict.fromkeys(("silu", "swish", "swiglu"), "silu"),
    **dict.fromkeys(("gelu", "geglu"), "gelu"),
    **dict.fromkeys(("gelu_new", "gelu_fast", "gelu_pytorch_tanh"), "gelu_tanh"),
    **{"relu2": "relu2", "relu": "relu", "quick_gelu": "quick_gelu"},
}
"""Hugging Face activation names by the function they compute (``transformers/activations.py`` ``ACT2FN``)."""
_DEFAULT_ACTIVATION = {"gpt2": "gelu_tanh", "gpt_bigcode": "gelu_tanh", "opt": "relu", "gpt_neox": "gelu"}


def _norm(cfg: dict[str, Any], where: str) -> str:
    kind = str(cfg.get("model_type", ""))
    if cfg.get("norm_type") is not None:
        if cfg["norm_type"] not in _NORM_TYPES:
            raise ConfigError(f"{where}: key 'norm_type' must be one of {', '.join(_NORM_TYPES)}")
        return str(cfg["norm_type"])
    if kind == "nemotron":  # Nemotron-4: NemotronLayerNorm1P
        return "layer_norm_1p"
    if kind.startswith(("gemma", "qwen3_next", "qwen3_5")):  # their RMSNorm scales by (1 + weight)
        return "rms_norm_1p"
    return "layer_norm" if kind in _LAYER_NORM_TYPES else "rms_norm"


def _activation(cfg: dict[str, Any]) -> str:
    """The MLP's activation (gated or not is ``ModelSpec.gated_mlp``); ``catalog`` has checked the name."""
    kind = str(cfg.get("model_type", ""))
    keys = ("hidden_act", "activation_function", "mlp_hidden_act", "hidden_activation")
    name = next((cfg[k] for k in keys if cfg.get(k) is not None), None)
    if name is None:
        name = "gelu_pytorch_tanh" if kind.startswith("gemma") else _DEFAULT_ACTIVATION.get(kind, "silu")
    return _ACTIVATIONS.get(str(name), str(name))


_SIGMOID_TYPES = frozenset({"deepseek_v3", "glm4_moe", "nemotron_h", "llama4_text"})
"""Model types that score experts with a sigmoid without a ``scoring_func`` key (transformers' routers)."""
_NORMALIZED_TYPES = frozenset({"mixtral", "gpt_oss", "deepseek_v3", "minimax_m2"})
"""Model types that renormalise the chosen weights without a ``norm_topk_prob`` key (their routers)."""
_BIAS_TYPES = frozenset({"glm4_moe", "nemotron_h"})
_OTHER_ROUTERS = {"phimoe": "sparsemixer", "llama4_text": "llama4"}


def _router(cfg: dict[str, Any], where: str) -> Router:
    """Read as Megatron-Bridge reads the same keys (``conversion/model_bridge.py`` ``CONFIG_MAPPING`` and the
    model bridges: ``moe_router_pre_softmax = not norm_topk_prob``, sigmoid and expert bias for DeepSeek-V3,
    GLM-4.5 and Nemotron-H)."""
    kind = str(cfg.get("model_type", ""))
    score = str(cfg.get("scoring_func") or ("sigmoid" if kind in _SIGMOID_TYPES else "softmax"))
    normalized = bool(cfg.get("norm_topk_prob", kind in _NORMALIZED_TYPES or score == "sigmoid"))
    groups = int(_number(cfg.get("n_group") or 1, "n_group", where))
    bias_keys = (
        cfg.get("topk_method") == "noaux_tc" or cfg.get("use_routing_bias") or cfg.get("moe_use_aux_free")
    )
    return Router(
        kind=_OTHER_ROUTERS.get(kind, "topk"),
        score=score,
        pre_softmax=score == "softmax" and not normalized,
        normalized=normalized,
        scale=_number(cfg.get("routed_scaling_factor") or 1.0, "routed_scaling_factor", where),
        groups=groups if groups > 1 else 0,
        group_topk=int(_number(cfg.get("topk_group") or 1, "topk_group", where)) if groups > 1 else 0,
        expert_bias=bool(bias_keys) or kind in _BIAS_TYPES,
        shared_gate=kind.startswith(("qwen2_moe", "qwen3_next", "qwen3_5"))
        and bool(cfg.get("shared_expert_intermediate_size")),
    )


def read_definition(cfg: dict[str, Any], where: str, *, moe: bool = False) -> Definition:
    """The ``Definition`` a config describes; a malformed value is a one-line ``ConfigError`` naming it."""
    key = next((k for k in _EPS_KEYS if cfg.get(k) is not None), None)
    eps = cfg[key] if key is not None else 1e-5
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 < eps < 1:
        raise ConfigError(f"{where}: key '{key}' must be a number in (0, 1), got {eps!r}")
    return Definition(
        rope=read_rope(cfg, where),
        qk_norm=_qk_norm(cfg),
        norm=_norm(cfg, where),
        norm_eps=float(eps),
        activation=_activation(cfg),
        router=_router(cfg, where) if moe else Router(),
    )
