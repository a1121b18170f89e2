"""Read models and hardware from data: presets, Hugging Face ``config.json`` / YAML, cluster files.

Every failure is a one-line ``ConfigError`` that names the file, the key and the fix.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import ConfigError
from autotune.hostprofile import NO_HOST_TIME, load_host_profile
from autotune.modelconfig import arch_fields, check_keys, is_gemma
from autotune.specs import ClusterSpec, GPUSpec, LinkSpec, ModelSpec
from autotune.userfile import read_text

__all__ = [
    "model_names",
    "gpu_names",
    "link_names",
    "load_model",
    "model_from_dict",
    "load_gpu",
    "load_link",
    "make_cluster",
]

_MIB = 1024**2
_GIB = 1024**3
_REQUIRED_MODEL_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
_GELU_ACTS = {"gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "relu", "quick_gelu", "relu2"}
"""Two-matrix MLPs (``relu2``: NemotronH's squared ReLU)."""
_GATED_ACTS = {"silu", "swiglu", "swish", "geglu"}


@cache
def _data(name: str) -> dict[str, Any]:
    text = resources.files("autotune.data").joinpath(name).read_text()
    return yaml.safe_load(text)


def model_names() -> list[str]:
    return sorted(_data("models.yaml"))


def preset_config(name: str) -> dict[str, Any]:
    """A preset's config.json keys: written in ``models.yaml``, or the published file its ``config`` names
    (``data/hf_configs/``), with the preset's ``source``."""
    preset = dict(_data("models.yaml")[name])
    if "config" in preset:
        text = resources.files("autotune.data").joinpath(preset.pop("config")).read_text()
        preset = {**json.loads(text), **preset}
    return preset


def gpu_names() -> list[str]:
    return sorted(_data("hardware.yaml")["gpus"])


def link_names() -> list[str]:
    hw = _data("hardware.yaml")
    return sorted([*hw["links"], *hw["link_aliases"]])


def _read_mapping(path: Path) -> dict[str, Any]:
    text = read_text(path, "")
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        line = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(
            f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'} ({line})"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys to values at the top level")
    return data


read_mapping = _read_mapping


def _int_field(cfg: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise ConfigError(f"{where}: missing key '{key}' (a positive integer)")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{where}: key '{key}' must be a positive integer, got {value!r}")
    return value


def _bool_field(cfg: dict[str, Any], key: str, where: str, default: bool) -> bool:
    value = cfg.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: key '{key}' must be true or false, got {value!r}")
    return value


def _is_gated(cfg: dict[str, Any], where: str) -> bool:
    act = cfg.get("hidden_act", cfg.get("activation_function", cfg.get("mlp_hidden_act")))
    model_type = str(cfg.get("model_type", ""))
    if is_gemma(cfg):
        return True
    if act is None:
        return model_type not in {"gpt2", "gpt_neox", "gptj", "opt", "bloom", "gpt_bigcode"}
    if not isinstance(act, str) or act not in _GELU_ACTS | _GATED_ACTS:
        raise ConfigError(
            f"{where}: key 'hidden_act' must be one of {sorted(_GELU_ACTS | _GATED_ACTS)}, got {act!r}"
        )
    return act in _GATED_ACTS


_TIED_BY_DEFAULT = frozenset({"cohere", "cohere2"})
"""Model types whose transformers config class ties the embeddings when config.json omits the key
(``CohereConfig(tie_word_embeddings=True)``; Command R's 35B counts one vocabulary matrix)."""


def _ties_by_default(cfg: dict[str, Any], gpt_like: bool) -> bool:
    """``tie_word_embeddings`` when config.json omits it: the family's transformers default."""
    return gpt_like or is_gemma(cfg) or str(cfg.get("model_type", "")) in _TIED_BY_DEFAULT


def model_from_dict(cfg: dict[str, Any], *, name: str) -> ModelSpec:
    """Build a ModelSpec from Hugging Face config keys (GPT-2's ``n_embd``/``n_layer``/``n_head`` too)."""
    check_keys(cfg, name)
    cfg = dict(cfg)
    for hf, gpt2 in (
        ("hidden_size", "n_embd"),
        ("num_hidden_layers", "n_layer"),
        ("num_attention_heads", "n_head"),
        ("max_position_embeddings", "n_positions"),
    ):
        if hf not in cfg and gpt2 in cfg:
            cfg[hf] = cfg[gpt2]
    missing = [k for k in _REQUIRED_MODEL_KEYS if k not in cfg]
    if missing:
        raise ConfigError(
            f"{name}: missing key '{missing[0]}' (a model file needs {', '.join(_REQUIRED_MODEL_KEYS)})"
        )
    h = _int_field(cfg, "hidden_size", name)
    heads = _int_field(cfg, "num_attention_heads", name)
    if h % heads and not cfg.get("head_dim"):
        raise ConfigError(f"{name}: 'hidden_size' {h} is not divisible by 'num_attention_heads' {heads}")
    kv = _int_field(cfg, "num_key_value_heads", name, default=heads)
    if heads % kv:
        raise ConfigError(
            f"{name}: 'num_attention_heads' {heads} is not divisible by 'num_key_value_heads' {kv}"
        )
    gated = _is_gated(cfg, name)
    ffn_default = 4 * h if not gated else None
    ffn_key = "intermediate_size_mlp" if "intermediate_size_mlp" in cfg else "intermediate_size"
    ffn = _int_field(cfg, ffn_key, name, default=cfg.get("n_inner") or ffn_default)
    gpt_like = str(cfg.get("model_type", "")) in {"gpt2", "gpt_bigcode", "opt"}
    layers = _int_field(cfg, "num_hidden_layers", name)
    return ModelSpec(
        name=name,
        hidden_size=h,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        ffn_hidden_size=ffn,
        vocab_size=_int_field(cfg, "vocab_size", name),
        max_seq_len=_int_field(cfg, "max_position_embeddings", name, default=4096),
        tie_embeddings=_bool_field(cfg, "tie_word_embeddings", name, default=_ties_by_default(cfg, gpt_like)),
        gated_mlp=gated,
        learned_positions=gpt_like,
        bias=gpt_like,
        **arch_fields(cfg, name, layers),
    )


def load_model(name_or_path: str) -> ModelSpec:
    """A preset name (``70b``, ``llama3-8b``, ``tiny``, ...) or a path to ``config.json`` / ``*.yaml``."""
    if name_or_path in _data("models.yaml"):
        return model_from_dict(preset_config(name_or_path), name=name_or_path)
    path = Path(name_or_path)
    if path.is_dir():
        hint = (
            f"did you mean --model {path / 'config.json'}?"
            if (path / "config.json").is_file()
            else "pass its config.json"
        )
        raise ConfigError(f"--model {name_or_path}: is a directory; {hint}")
    if path.suffix in {".json", ".yaml", ".yml"} or path.exists():
        return model_from_dict(_read_mapping(path), name=str(path))
    raise unknown_model(name_or_path)


def unknown_model(name: str, field: str = "--model") -> ConfigError:
    """The one-line error for a name that is no preset and no file, with the closest presets."""
    known = model_names()
    return ConfigError(
        f"{field}: unknown model {name!r}{_did_you_mean(name, known)}; known "
        f"presets: {', '.join(known)}, or a path to a Hugging Face config.json / YAML"
    )


def _did_you_mean(name: str, known: list[str]) -> str:
    """`` (did you mean X?)`` for a misspelt or under-specified catalog key (``H100`` -> h100-sxm, h100-pcie;
    a Hugging Face repo id -> download its config.json), else ''."""
    key = name.lower().rsplit("/", 1)[-1].replace("meta-llama-", "llama").replace("_", "-")
    near = [k for k in known if k.startswith(key)] or difflib.get_close_matches(key, known, n=2, cutoff=0.6)
    repo = ""
    if re.fullmatch(r"[\w.-]+/[\w.-]+", name) and not Path(name).exists():
        repo = " (a Hugging Face repo id: download its config.json and pass that path)"
    if not near:
        return repo
    return f"{repo} (did you mean {' or '.join(near)}?)"


def _tflops(value: Any) -> float | None:
    return None if value is None else float(value) * 1e12


def load_gpu(name: str) -> GPUSpec:
    gpus = _data("hardware.yaml")["gpus"]
    if name not in gpus:
        raise ConfigError(
            f"--gpu: unknown GPU {name!r}{_did_you_mean(name, gpu_names())}; known: {', '.join(gpu_names())}"
        )
    g = gpus[name]
    return GPUSpec(
        key=name,
        name=g["name"],
        bf16_flops=_tflops(g["bf16_tflops"]),
        fp16_flops=_tflops(g["fp16_tflops"]),
        fp8_flops=_tflops(g["fp8_tflops"]),
        fp32_flops=_tflops(g["fp32_tflops"]),
        memory_bytes=int(g["memory_mib"]) * _MIB,
        memory_bandwidth_bytes_per_s=g["memory_bandwidth_gb_s"] * 1e9,
        gemm_efficiency=float(g["gemm_efficiency"]),
        intra_node_link=g["intra_node_link"],
        default_gpus_per_node=int(g["default_gpus_per_node"]),
        default_inter_node_link=g["default_inter_node_link"],
        default_nics_per_node=int(g["default_nics_per_node"]),
        sources=tuple(g.get("sources", ())),
        half_bytes=int(g.get("half_bytes", 2)),
        host=load_host_profile(g["host_profile"]) if "host_profile" in g else NO_HOST_TIME,
        async_collectives=bool(g.get("async_collectives", True)),
        gemm_shape_curve=_points(g.get("gemm_shape_curve")),
        fp8_gemm_scale=float(g.get("fp8_gemm_scale", 1.0)),
        attention_curves=tuple(
            (kernel, _points(c["fwd"]), _points(c["bwd"])) for kernel, c in (g.get("attention") or {}).items()
        ),
        attention_head_dim=tuple(
            (kernel, int(qk), int(v), float(fwd), float(bwd))
            for kernel, points in (g.get("attention_head_dim") or {}).items()
            for qk, v, fwd, bwd in points
        ),
        tdp_w=g.get("tdp_w"),
        power_limit_w=g.get("power_limit_w"),
        sm_count=g.get("sm_count"),
        compute_capability=g.get("compute_capability"),
        nvlink_domain_gpus=g.get("nvlink_domain_gpus"),
        fp8_intensity_factor=_optional_float(g.get("fp8_intensity_factor")),
        host_link_bytes_per_s=None if g.get("host_link_gb_s") is None else float(g["host_link_gb_s"]) * 1e9,
    )


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _points(value: Any) -> tuple[tuple[float, float], ...]:
    """A curve from hardware.yaml: ``[[x, y], ...]`` sorted by x."""
    return tuple(sorted((float(x), float(y)) for x, y in (value or ())))


def load_link(name: str, *, flag: str = "--inter-node") -> LinkSpec:
    hw = _data("hardware.yaml")
    key = hw["link_aliases"].get(name, name)
    if key not in hw["links"]:
        raise ConfigError(f"{flag}: unknown link {name!r}; known: {', '.join(link_names())}")
    link = hw["links"][key]
    return LinkSpec(
        key=key,
        bw_bytes_per_s=link["bw_gb_s"] * 1e9,
        latency_s=link["latency_us"] * 1e-6,
        sources=tuple(link.get("sources", ())),
        ring_hop_s=link["nccl_ring_hop_us"] * 1e-6 if "nccl_ring_hop_us" in link else None,
    )


def _link_typical_nics(name: str, fallback: int) -> int:
    hw = _data("hardware.yaml")
    link = hw["links"].get(hw["link_aliases"].get(name, name), {})
    return int(link.get("typical_nics_per_node", fallback))


_MAX_HOST_MEMORY_GIB = 1 << 20
"""1 PiB of host RAM per node: far above any server; a larger value is a typo (or nan/inf)."""


def make_cluster(
    *,
    num_gpus: int,
    gpu: str | GPUSpec = "h100-sxm",
    gpus_per_node: int | None = None,
    intra_node: str | None = None,
    inter_node: str | None = None,
    nics_per_node: int | None = None,
    host_memory_gib: float | None = None,
    nvlink_domain_gpus: int | None = None,
) -> ClusterSpec:
    """A homogeneous cluster from the CLI flags ``--gpus N --gpu T [--gpus-per-node K]``; ``gpu`` may be a
    described GPU (``usergpu``)."""
    spec = gpu if isinstance(gpu, GPUSpec) else load_gpu(gpu)
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus <= 0:
        raise ConfigError(f"--gpus: must be a positive integer, got {num_gpus!r}")
    per_node = gpus_per_node if gpus_per_node is not None else min(num_gpus, spec.default_gpus_per_node)
    if isinstance(per_node, bool) or not isinstance(per_node, int) or per_node <= 0:
        raise ConfigError(f"--gpus-per-node: must be a positive integer, got {per_node!r}")
    if num_gpus % per_node:
        raise ConfigError(
            f"--gpus {num_gpus} is not a multiple of --gpus-per-node {per_node}; "
            f"use a multiple such as {math.ceil(num_gpus / per_node) * per_node}"
        )
    if nics_per_node is not None:
        nics = nics_per_node
    elif inter_node is not None:  # another network than the GPU's usual: its usual port count
        nics = _link_typical_nics(inter_node, spec.default_nics_per_node)
    else:
        nics = spec.default_nics_per_node
    if isinstance(nics, bool) or not isinstance(nics, int) or nics <= 0:
        raise ConfigError(f"nics_per_node: must be a positive integer, got {nics!r}")
    if host_memory_gib is not None and not 0 < host_memory_gib <= _MAX_HOST_MEMORY_GIB:  # nan fails too
        raise ConfigError(
            f"--host-memory-gib: host RAM per node must be in (0, {_MAX_HOST_MEMORY_GIB}] GiB, "
            f"got {host_memory_gib!r}"
        )
    domain = nvlink_domain_gpus if nvlink_domain_gpus is not None else spec.nvlink_domain_gpus
    if domain is not None and (
        isinstance(domain, bool) or not isinstance(domain, int) or domain <= 0 or domain % per_node
    ):
        raise ConfigError(
            f"nvlink_domain_gpus: must be a positive multiple of gpus_per_node {per_node}, got {domain!r}"
        )
    return ClusterSpec(
        name=f"{num_gpus // per_node}x{per_node} {spec.key}",
        gpu=spec,
        num_nodes=num_gpus // per_node,
        gpus_per_node=per_node,
        intra_link=load_link(intra_node or spec.intra_node_link, flag="--intra-node"),
        inter_link=load_link(inter_node or spec.default_inter_node_link),
        nics_per_node=nics,
        host_memory_bytes_per_node=int((host_memory_gib if host_memory_gib is not None else 1024) * _GIB),
        nvlink_domain_gpus=domain,
    )
