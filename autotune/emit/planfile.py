"""``plan.json``: a self-describing plan document (plan + model + cluster + estimate).

``autotune emit --plan runs/x/best/plan.json --out d`` needs nothing else: the model is stored as the
Hugging Face ``config.json`` keys that ``catalog.model_from_dict`` reads, and the cluster as the keys of a
cluster YAML, so both round-trip through the same parsers a user's files go through. A bare mapping of
``ParallelPlan`` fields (what ``ParallelPlan.to_dict`` writes) is accepted too; then the model and the
cluster must come from flags.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune import __version__
from autotune.catalog import make_cluster, model_from_dict
from autotune.definition import Router
from autotune.errors import ConfigError
from autotune.plan import ParallelPlan
from autotune.specs import ClusterSpec, ModelSpec
from autotune.userfile import read_text

__all__ = ["PLAN_FORMAT", "PlanDocument", "plan_document", "read_plan_document", "model_to_config"]

PLAN_FORMAT = "autotune-plan/1"
_GIB = 1024**3
_DOC_KEYS = {"format", "autotune_version", "plan", "model", "cluster", "estimate"}


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanDocument:
    """What a plan file holds; model and cluster are None for a bare plan mapping."""

    plan: ParallelPlan
    model: ModelSpec | None = None
    cluster: ClusterSpec | None = None
    estimate: dict[str, Any] | None = None
    """The cost model's verdict when the file was written (``Estimate.to_dict()``), for reference."""


def model_to_config(model: ModelSpec) -> dict[str, Any]:
    """The Hugging Face ``config.json`` keys that rebuild ``model`` with ``catalog.model_from_dict``."""
    gpt_like = model.learned_positions or model.bias
    cfg = {
        "model_type": "gpt2" if gpt_like else "llama",
        "hidden_size": model.hidden_size,
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_heads,
        "num_key_value_heads": model.num_kv_heads,
        "intermediate_size": model.ffn_hidden_size,
        "vocab_size": model.vocab_size,
        "max_position_embeddings": model.max_seq_len,
        "tie_word_embeddings": model.tie_embeddings,
    }  # the activation is the definition's (``_definition_config``)
    cfg = {**cfg, **_arch_config(model), **_definition_config(model)}
    router = model.definition.router
    if model.is_moe and cfg["model_type"] == "llama":  # what only a family's type says of its router
        family = {"sparsemixer": "phimoe", "llama4": "llama4_text"}.get(router.kind)
        family = family or ("qwen2_moe" if router.shared_gate else None)  # gates its shared expert
        if family:
            cfg.update(model_type=family, attention_bias=model.attention_bias)
    return cfg


_QK_NORM_KEYS: dict[str, dict[str, Any]] = {
    "head": {"qk_norm_type": "per_head"},
    "full": {"qk_norm_type": "per_layer"},
    "l2": {"use_qk_norm": True},
}


_ACTIVATION_NAMES = {"gelu_tanh": "gelu_pytorch_tanh"}
"""``Definition.activation`` -> a Hugging Face name ``ACT2FN`` maps to it (the others are their own)."""


def _definition_config(model: ModelSpec) -> dict[str, Any]:
    """The keys ``autotune.definition`` reads back: the activation (a gated GELU is ``geglu``), the norm
    (StarCoder2's ``norm_type``), RoPE, the Q/K norm (MiniMax's ``qk_norm_type`` names either kind), the
    norms' epsilon."""
    d = model.definition
    rope, act = d.rope, _ACTIVATION_NAMES.get(d.activation, d.activation)
    cfg: dict[str, Any] = {"rope_theta": rope.theta, "rms_norm_eps": d.norm_eps, "norm_type": d.norm}
    geglu = model.gated_mlp and d.activation.startswith("gelu") and model.num_layer_norms != 4
    cfg["hidden_act"] = "geglu" if geglu else act  # Gemma's type gates its GELU whatever the name
    if rope.fraction != 1.0:
        cfg["partial_rotary_factor"] = rope.fraction
    if rope.scaling:
        cfg["rope_scaling"] = {
            "rope_type": rope.scaling,
            "factor": rope.factor,
            "low_freq_factor": rope.low_freq_factor,
            "high_freq_factor": rope.high_freq_factor,
            "beta_fast": rope.beta_fast,
            "beta_slow": rope.beta_slow,
            "mscale": rope.mscale,
            "mscale_all_dim": rope.mscale_all_dim,
        }
        if rope.original_positions:
            cfg["rope_scaling"]["original_max_position_embeddings"] = rope.original_positions
    return cfg | _QK_NORM_KEYS.get(d.qk_norm, {}) | (_router_config(d.router) if model.is_moe else {})


def _router_config(r: Router) -> dict[str, Any]:
    """The router keys ``definition._router`` reads back (the rest by the model type: ``model_to_config``)."""
    return {
        "scoring_func": r.score,
        "norm_topk_prob": r.normalized,
        "routed_scaling_factor": r.scale,
        "n_group": r.groups or 1,
        "topk_group": r.group_topk or 1,
        "topk_method": "noaux_tc" if r.expert_bias else "greedy",
    }


def _arch_config(model: ModelSpec) -> dict[str, Any]:
    """Keys of the fields beyond the dense core (``autotune.modelconfig`` reads them back); the model type
    carries what only a family implies (Gemma 2's four norms, gpt-oss's expert biases, Llama 4's chunks)."""
    cfg: dict[str, Any] = {}
    if model.num_layer_norms == 4:
        cfg["model_type"] = "gemma2"
    if model.expert_bias:
        cfg["model_type"] = "gpt_oss"
    if model.attention_head_dim:
        cfg["head_dim"] = model.attention_head_dim
    if model.attention_bias:
        cfg["attention_bias"] = True
    if model.is_moe:
        cfg.update(
            num_experts=model.num_experts,
            num_experts_per_tok=model.experts_per_token,
            moe_intermediate_size=model.expert_ffn_hidden_size,
            shared_expert_intermediate_size=model.shared_ffn_hidden_size,
            moe_layers=list(model.moe_layers),
        )
        if model.moe_latent_size:
            cfg["moe_latent_size"] = model.moe_latent_size
    if model.uses_mla:
        cfg.update(
            q_lora_rank=model.q_lora_rank,
            kv_lora_rank=model.kv_lora_rank,
            qk_rope_head_dim=model.qk_rope_head_dim,
            qk_nope_head_dim=model.qk_nope_head_dim,
            v_head_dim=model.v_head_dim,
        )
    if model.mtp_layers:  # DeepSeek-V3 / GLM-4.5 multi-token prediction modules (``costmodel.mtp``)
        cfg["num_nextn_predict_layers"] = model.mtp_layers
    if model.attention_output_gate:
        cfg["attn_output_gate"] = True
    linear = model.num_linear_layers
    if linear:  # Qwen3.5's way: the layers by type (``modelconfig._linear_fields``)
        cfg.update(
            linear_num_key_heads=model.linear_key_heads,
            linear_num_value_heads=model.linear_value_heads,
            linear_key_head_dim=model.linear_key_head_dim,
            linear_value_head_dim=model.linear_value_head_dim,
            linear_conv_kernel_dim=model.linear_conv_kernel,
            layer_types=["linear_attention"] * linear + ["full_attention"] * (model.num_layers - linear),
        )
    if model.layer_pattern:  # NemotronH's keys (``modelconfig._hybrid_fields``)
        cfg.update(model_type="nemotron_h", hybrid_override_pattern=model.layer_pattern)
        if model.mtp_pattern:
            cfg.update(mtp_hybrid_override_pattern=model.mtp_pattern, mtp_use_repeated_layer=model.mtp_shared)
        if model.is_moe:
            cfg["n_routed_experts"] = cfg.pop("num_experts")
        if model.mamba_heads:
            cfg.update(
                mamba_num_heads=model.mamba_heads,
                mamba_head_dim=model.mamba_head_dim,
                ssm_state_size=model.mamba_state_dim,
                n_groups=model.mamba_groups,
                conv_kernel=model.mamba_conv_kernel,
            )
    local = model.num_local_layers
    if model.chunked_attention:
        cfg.update(
            model_type="llama4_text",
            attention_chunk_size=model.attention_window,
            no_rope_layers=[1] * local + [0] * (model.num_layers - local),
        )
    elif local and model.attention_window:
        full = model.num_layers - local - linear
        cfg.update(
            sliding_window=model.attention_window,
            layer_types=["linear_attention"] * linear
            + ["sliding_attention"] * local
            + ["full_attention"] * full,
        )
    return cfg


def _cluster_to_dict(cluster: ClusterSpec) -> dict[str, Any]:
    return {
        "name": cluster.name,
        "gpu": cluster.gpu.key,
        "num_nodes": cluster.num_nodes,
        "gpus_per_node": cluster.gpus_per_node,
        "intra_node_link": cluster.intra_link.key,
        "inter_node_link": cluster.inter_link.key,
        "nics_per_node": cluster.nics_per_node,
        "host_memory_gib": cluster.host_memory_bytes_per_node / _GIB,
    }


def plan_document(
    plan: ParallelPlan, model: ModelSpec, cluster: ClusterSpec, estimate: dict[str, Any] | None
) -> dict[str, Any]:
    """The JSON object ``emit_all`` writes as ``plan.json``."""
    return {
        "format": PLAN_FORMAT,
        "autotune_version": __version__,
        "plan": plan.to_dict(),
        "model": {"name": model.name, "config": model_to_config(model)},
        "cluster": _cluster_to_dict(cluster),
        "estimate": estimate,
    }


def _model_from(data: Any, where: str) -> ModelSpec:
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
        raise ConfigError(f"{where}: 'model' must be a mapping with 'name' and 'config'")
    return model_from_dict(data["config"], name=str(data.get("name", where)))


def _cluster_from(data: Any, where: str) -> ClusterSpec:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: 'cluster' must be a mapping")
    try:
        nodes, per_node = int(data["num_nodes"]), int(data["gpus_per_node"])
        return make_cluster(
            num_gpus=nodes * per_node,
            gpu=str(data["gpu"]),
            gpus_per_node=per_node,
            intra_node=data.get("intra_node_link"),
            inter_node=data.get("inter_node_link"),
            nics_per_node=data.get("nics_per_node"),
            host_memory_gib=data.get("host_memory_gib"),
        )
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{where}: 'cluster' needs gpu, num_nodes and gpus_per_node ({e})") from None


def read_plan_document(path: str | Path) -> PlanDocument:
    """Read ``plan.json`` as written by ``emit_all`` (or a bare plan mapping)."""
    where = str(path)
    try:
        data = json.loads(read_text(path, "--plan"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: not valid JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a JSON object")
    if "plan" not in data:  # a bare ParallelPlan mapping
        return PlanDocument(plan=ParallelPlan.from_dict(data, where=where))
    unknown = sorted(set(data) - _DOC_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key '{unknown[0]}'; allowed: {', '.join(sorted(_DOC_KEYS))}")
    if data.get("format", PLAN_FORMAT) != PLAN_FORMAT:
        raise ConfigError(f"{where}: format {data['format']!r} is not {PLAN_FORMAT!r}; re-run autotune emit")
    estimate = data.get("estimate")
    return PlanDocument(
        plan=ParallelPlan.from_dict(data["plan"], where=f"{where}: plan"),
        model=_model_from(data["model"], where) if data.get("model") is not None else None,
        cluster=_cluster_from(data["cluster"], where) if data.get("cluster") is not None else None,
        estimate=estimate if isinstance(estimate, dict) else None,
    )
