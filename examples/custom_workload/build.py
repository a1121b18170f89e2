"""A workload of your own for ``autotune search --workload examples.custom_workload.build:build``.

A GPT-2-style decoder (LayerNorm, learned positions, GELU MLP), written independently of autotune's built-in
model, with its own batches. It shows every field of ``autotune.workload.Workload``: the block class (FSDP2
shards and full recompute checkpoints each ``GPTBlock``), a tensor-parallel plan by submodule name, and the
attention core for selective recompute. Runs on CPU (gloo) as on GPUs::

    autotune search --model tiny --gpus 2 --gpu cpu --device cpu --backend torchrun \\
        --workload examples.custom_workload.build:build --trials 3 --global-batch 8 --seq-len 64

The ``--model`` preset gives the sizes (``spec``) and is what the cost model prices; a builder may ignore it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autotune.plan import ParallelPlan
from autotune.specs import ModelSpec
from autotune.workload import Workload


class CausalCore(nn.Module):
    """Parameter-free attention core: what selective recompute re-runs in backward."""

    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.head_dim = head_dim

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # Heads from the tensor width, not the config: under TP each rank holds 1/TP of them.
        q, k, v = (t.unflatten(-1, (-1, self.head_dim)).transpose(1, 2) for t in (q, k, v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(-2)


class SelfAttention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))
        self.core = CausalCore(width // heads)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.core(self.q(x), self.k(x), self.v(x)))


class GPTBlock(nn.Module):
    def __init__(self, width: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = SelfAttention(width, heads)
        self.fc, self.proj = nn.Linear(width, ffn), nn.Linear(ffn, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, *, vocab: int, width: int, heads: int, ffn: int, layers: int, max_len: int) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(max_len, width)
        self.blocks = nn.ModuleList(GPTBlock(width, heads, ffn) for _ in range(layers))
        self.ln_f, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tokens(tokens) + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_f(h))


def build(spec: ModelSpec, plan: ParallelPlan, device: torch.device) -> Workload:
    with torch.device(device):
        model = TinyGPT(
            vocab=spec.vocab_size,
            width=spec.hidden_size,
            heads=spec.num_heads,
            ffn=spec.ffn_hidden_size,
            layers=spec.num_layers,
            max_len=max(plan.seq_len, 8),
        )

    def batch(step: int, micro_batch: int, seq_len: int, device: torch.device):
        """Counting sequences (learnable); the same for every rank of a step, as TP ranks need."""
        g = torch.Generator().manual_seed(step)
        start = torch.randint(spec.vocab_size, (micro_batch, 1), generator=g)
        tokens = (start + torch.arange(seq_len + 1)) % spec.vocab_size
        return tokens[:, :-1].to(device), tokens[:, 1:].to(device)

    return Workload(
        model=model,
        batch=batch,
        block=GPTBlock,
        selective=("attn.core",),
        tp_plan={
            "attn.q": "colwise",
            "attn.k": "colwise",
            "attn.v": "colwise",
            "attn.out": "rowwise",
            "fc": "colwise",
            "proj": "rowwise",
        },
    )
