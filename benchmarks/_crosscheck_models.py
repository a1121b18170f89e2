"""The models ``memory_crosscheck.py`` measures: small Llama-shaped transformers (GQA, SwiGLU) on CPU and
on one GPU. Shapes only: the measured peaks live in benchmarks/results/memory_crosscheck*.json."""

from autotune.specs import ModelSpec

__all__ = ["SMALL", "TINY", "GPU_MODEL", "GPU_MODEL_8B", "ACCUMULATION", "WIDE_WORLD", "cpu_setup"]

# Llama-shaped, GQA, SwiGLU; sized so that one step runs in well under a second on 2 CPU cores.
SMALL = ModelSpec(
    name="crosscheck-small",
    hidden_size=256,
    num_layers=4,
    num_heads=8,
    num_kv_heads=4,
    ffn_hidden_size=688,
    vocab_size=2048,
    max_seq_len=512,
)
TINY = ModelSpec(
    name="crosscheck-tiny",
    hidden_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    ffn_hidden_size=344,
    vocab_size=512,
    max_seq_len=128,
)
GPU_MODEL = ModelSpec(
    name="crosscheck-gpu",
    hidden_size=2048,
    num_layers=8,
    num_heads=16,
    num_kv_heads=4,
    ffn_hidden_size=5632,
    vocab_size=32000,
    max_seq_len=2048,
)

GPU_MODEL_8B = ModelSpec(
    name="crosscheck-gpu-8b-width",
    hidden_size=4096,
    num_layers=4,
    num_heads=32,
    num_kv_heads=8,
    ffn_hidden_size=14336,
    vocab_size=128256,
    max_seq_len=8192,
)
"""Llama 3 8B's width, heads, FFN and vocabulary at 8192 tokens, 4 of its 32 layers (``--gpu-model 8b``): the
per-layer activations and the loss path at the size the published 8B runs use, on one GPU."""

ACCUMULATION = 2
"""Micro-batches per step: gradients from the first are alive during the second's forward."""
WIDE_WORLD = 8
"""Fake-PG ranks of the wide cases (``memory_crosscheck.wide_cases``)."""


def cpu_setup(tiny: bool) -> tuple[ModelSpec, int, int, tuple[int, ...]]:
    """(model, micro-batch, sequence length, fake-PG world sizes) of the CPU runs."""
    return (TINY, 4, 128, (4,)) if tiny else (SMALL, 4, 256, (4, 8))
