"""A GPU the user describes: an inline ``gpu:`` mapping in a cluster YAML or a ``--gpu-spec FILE``.

Either a whole GPU (``name``, ``memory_gib``, ``memory_bandwidth_gb_s``, ``bf16_tflops`` at least) or
``base: <catalog key>`` with the keys that differ (an H100 with 96 GB HBM2e, a card capped at 500 W, an
H800's NVLink). Peaks are dense (no 2:4 sparsity), bandwidths per direction. Every mistake is a one-line
``ConfigError`` naming the key and the fix.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError
from autotune.specs import GPUSpec

__all__ = ["gpu_from_mapping", "load_gpu_spec", "GPU_KEYS", "UNVALIDATED_GEMM_EFFICIENCY"]

_MIB = 1024**2
UNVALIDATED_GEMM_EFFICIENCY = 0.6
"""``gemm_efficiency`` of a described GPU without a ``base`` or its own figure: the catalog's value for GPUs
not yet validated against measurements (data/hardware.yaml); `autotune probe --device cuda` measures it."""
_NUMBERS = {  # key -> (GPUSpec field, unit, required without a base)
    "bf16_tflops": ("bf16_flops", 1e12, True),
    "fp16_tflops": ("fp16_flops", 1e12, False),
    "fp8_tflops": ("fp8_flops", 1e12, False),
    "fp32_tflops": ("fp32_flops", 1e12, False),
    "memory_gib": ("memory_bytes", 1024 * _MIB, True),
    "memory_mib": ("memory_bytes", _MIB, False),
    "memory_bandwidth_gb_s": ("memory_bandwidth_bytes_per_s", 1e9, True),
    "power_limit_w": ("power_limit_w", 1.0, False),
    "tdp_w": ("tdp_w", 1.0, False),
    "sm_count": ("sm_count", 1, False),
    "compute_capability": ("compute_capability", 1.0, False),
    "host_link_gb_s": ("host_link_bytes_per_s", 1e9, False),
    "gemm_efficiency": ("gemm_efficiency", 1.0, False),
    "default_gpus_per_node": ("default_gpus_per_node", 1, False),
    "default_nics_per_node": ("default_nics_per_node", 1, False),
}
_NAMES = {
    "name": "name",
    "intra_node_link": "intra_node_link",
    "default_inter_node_link": "default_inter_node_link",
}
GPU_KEYS = frozenset({"base", "key", *_NUMBERS, *_NAMES})


def _number(cfg: dict[str, Any], key: str, where: str) -> float | None:
    value = cfg[key]
    if value is None and key in {"fp8_tflops", "fp16_tflops", "fp32_tflops"}:
        return None  # the GPU lacks the format
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigError(f"{where}: gpu key '{key}' must be a positive number, got {value!r}")
    if key == "gemm_efficiency" and value > 1:
        raise ConfigError(
            f"{where}: gpu key 'gemm_efficiency' is a fraction of the peak in (0, 1], got {value!r}"
        )
    return value


def gpu_from_mapping(cfg: dict[str, Any], *, where: str) -> GPUSpec:
    """A GPUSpec from a user's mapping (module docstring); ``base`` starts from a catalog GPU."""
    from autotune.catalog import gpu_names, link_names, load_gpu

    if not isinstance(cfg, dict):
        raise ConfigError(f"{where}: 'gpu' must be a catalog name or a mapping of GPU keys")
    unknown = sorted(set(cfg) - GPU_KEYS, key=str)
    if unknown:
        raise ConfigError(f"{where}: unknown gpu key {unknown[0]!r}; allowed: {', '.join(sorted(GPU_KEYS))}")
    base_name = cfg.get("base")
    if base_name is not None and base_name not in gpu_names():
        raise ConfigError(
            f"{where}: gpu key 'base' must be a catalog GPU ({', '.join(gpu_names())}), got {base_name!r}"
        )
    if base_name is None:
        missing = [
            k
            for k, (_, _, req) in _NUMBERS.items()
            if req and k not in cfg and not (k == "memory_gib" and "memory_mib" in cfg)
        ]
        missing += ["name"] if "name" not in cfg else []
        if missing:
            raise ConfigError(
                f"{where}: gpu needs key '{missing[0]}' (or 'base: <catalog GPU>' to start from)"
            )
    for key in ("intra_node_link", "default_inter_node_link"):
        if key in cfg and cfg[key] not in link_names():
            raise ConfigError(f"{where}: gpu key '{key}' must be a link name ({', '.join(link_names())})")
    base = load_gpu(base_name) if base_name else load_gpu("h100-sxm")
    changes: dict[str, Any] = {}
    for key, (field, unit, _) in _NUMBERS.items():
        if key in cfg:
            value = _number(cfg, key, where)
            whole = field.startswith(("memory_b", "default_"))
            changes[field] = None if value is None else (int(value * unit) if whole else value * unit)
    changes |= {field: str(cfg[key]) for key, field in _NAMES.items() if key in cfg}
    if base_name is None:  # a new GPU: nothing measured of the h100 template may carry over
        changes.setdefault("fp16_flops", changes["bf16_flops"])
        changes.setdefault("fp8_flops", None)
        changes.setdefault("fp32_flops", None)
        changes.setdefault("gemm_efficiency", UNVALIDATED_GEMM_EFFICIENCY)
        changes |= {"gemm_shape_curve": (), "attention_curves": (), "attention_head_dim": ()}
        changes |= {"fp8_gemm_scale": 1.0, "tdp_w": None}
        changes["fp8_intensity_factor"] = None
    spec = dataclasses.replace(
        base,
        key=str(cfg.get("key") or base_name or "custom"),
        sources=(*(base.sources if base_name else ()), f"described in {where}"),
        **changes,
    )
    if spec.power_limit_w and spec.tdp_w is None:
        raise ConfigError(f"{where}: gpu key 'power_limit_w' needs 'tdp_w' (the power its peaks hold at)")
    return spec


def load_gpu_spec(path: str | Path) -> GPUSpec:
    """``--gpu-spec FILE``: a YAML/JSON mapping of GPU keys (module docstring)."""
    from autotune.catalog import read_mapping

    return gpu_from_mapping(read_mapping(Path(path)), where=str(path))
