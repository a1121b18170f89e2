"""The FSDP stacks of benchmarks/data/modern_runs.yaml, read as autotune's framework fsdp.

torchtitan (FSDP2), MosaicML llm-foundry (composer, torch FSDP1) and NeMo AutoModel (FSDP2) rows are priced as
framework fsdp plans; what sets their recipes apart from torchtitan's is the row's numerics: llm-foundry's
default ``loss_fn: fused_crossentropy`` (``knobs.fused_cross_entropy``: ``plan.loss_kernel`` fused) and
AutoModel's bf16 model and loss (``row["numerics"]``: ``weight_dtype``, ``adam_dtype``, ``loss_kernel``).
Shared by modern_runs.py, memory_published.py and moe_recipes.py.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FSDP_STACKS", "row_numerics"]

FSDP_STACKS = ("torchtitan", "llm-foundry", "automodel")


def row_numerics(row: dict[str, Any]) -> dict[str, Any]:
    """The stored dtypes and loss kernel a framework fsdp row ran, as plan fields ({} for torchtitan's)."""
    out = {k: v for k, v in (row.get("numerics") or {}).items() if v is not None}
    if (row.get("knobs") or {}).get("fused_cross_entropy"):
        out.setdefault("loss_kernel", "fused")
    return out
