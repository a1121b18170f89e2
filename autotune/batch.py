"""The global batch when the user gives none: the search never tunes it (it changes convergence), so a default
is a fixed token count in whole sequences, shared by ``search``, ``scale`` and the CLI."""

from __future__ import annotations

__all__ = ["DEFAULT_GLOBAL_BATCH_TOKENS", "default_global_batch"]

DEFAULT_GLOBAL_BATCH_TOKENS = 4 * 1024 * 1024
"""When no --global-batch is given: ~4M tokens per step (Llama 2 paper Sec. 2.2), as whole sequences."""


def default_global_batch(seq_len: int, multiple: int) -> int:
    """~4M tokens in whole sequences, rounded down to a multiple of ``multiple`` (DP x micro-batch)."""
    sequences = max(1, DEFAULT_GLOBAL_BATCH_TOKENS // seq_len)
    return max(multiple, sequences // multiple * multiple)
