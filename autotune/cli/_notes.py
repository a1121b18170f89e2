"""Notes on stderr when a default was adjusted or looks poor for this model and cluster (never an error)."""

from __future__ import annotations

from typing import Any

from autotune.cli._args import DEFAULT_GLOBAL_BATCH_TOKENS
from autotune.specs import ClusterSpec, ModelSpec

__all__ = ["batch_notes"]

_LARGE_BATCH_TOKENS = 16 * 1024 * 1024
"""Llama 3 405B trained on 16K H100s at up to 16M tokens per step (Llama 3 paper, Sec. 3.4.1)."""


def batch_notes(
    model: ModelSpec, cluster: ClusterSpec, ctx: Any, *, global_batch_given: bool, seq_len_given: bool
) -> list[str]:
    """What the user may not have meant: a sequence longer than the model's positions, a default batch that
    was raised to give every data-parallel rank a sequence, or fewer sequences per step than GPUs."""
    notes = []
    tokens = ctx.global_batch * ctx.seq_len
    if seq_len_given and ctx.seq_len > model.max_seq_len:
        notes.append(
            f"--seq-len {ctx.seq_len} is above {model.name}'s max_position_embeddings "
            f"{model.max_seq_len}: planned as asked, but the model was not made for it"
        )
    if not global_batch_given and tokens > 1.5 * DEFAULT_GLOBAL_BATCH_TOKENS:
        notes.append(
            f"the default ~4M-token batch became {ctx.global_batch:,} sequences "
            f"({tokens / 1e6:.1f}M tokens) so that each data-parallel rank has one; pass "
            "--global-batch to choose"
        )
    if ctx.global_batch < cluster.num_gpus:
        notes.append(
            f"{ctx.global_batch:,} sequences per step on {cluster.num_gpus:,} GPUs: too few to fill "
            f"pipelines or large GEMMs, so expect a low MFU; runs at this scale use larger batches "
            f"(Llama 3 405B: {_LARGE_BATCH_TOKENS // 2**20}M tokens on 16K GPUs): --global-batch"
        )
    return notes
