"""The trial workload: a Llama-style decoder built from any ``ModelSpec``, and its synthetic data.

RMSNorm (LayerNorm when ``spec.bias``), rotary positions (learned when ``spec.learned_positions``),
SwiGLU or GELU MLP (a Mixture-of-Experts layer, ``trials.moe``, on the layers ``spec.moe_layers`` names),
GQA through ``F.scaled_dot_product_attention(is_causal=True)``. Module names follow
Hugging Face Llama (``q_proj``, ``o_proj``, ``gate_proj``, ``down_proj``, ``lm_head``) so that name-driven
tensor-parallel tools (DeepSpeed AutoTP) recognise the layers.

Initialisation is deterministic and independent of layout: every plain parameter is drawn from its own
generator seeded by ``(seed, parameter name)``, so a rank that builds only some layers (a pipeline
stage) gets exactly the weights the single-process reference has. Parameters that are already
DTensors (built on ``meta`` and sharded before materialising, for models too big to build whole) use
the global RNG instead: deterministic, but the values then depend on the layout.

Only torch is imported here: this module runs on GPU machines without optuna or deepspeed.
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn.functional as F
from torch import nn

from autotune.specs import ModelSpec
from autotune.trials.moe import MoE

__all__ = ["Transformer", "Block", "build_model", "init_weights", "synthetic_batch", "model_flops_per_token"]

_INIT_STD = 0.02
_ROPE_THETA = 10000.0


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def make_norm(spec: ModelSpec) -> nn.Module:
    """RMSNorm (Llama); LayerNorm with a bias for GPT-style specs (``bias=True``), as ``ModelSpec`` counts."""
    return nn.LayerNorm(spec.hidden_size) if spec.bias else RMSNorm(spec.hidden_size)


def rotary(x: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` of shape ``[batch, seq, heads, head_dim]`` by its positions (Su et al. 2021)."""
    seq, head_dim = x.shape[1], x.shape[-1]
    inv_freq = _ROPE_THETA ** -(torch.arange(0, head_dim, 2, device=x.device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq, device=x.device, dtype=torch.float32), inv_freq)
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
    x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.type_as(x)


class AttentionCore(nn.Module):
    """Rotary + causal SDPA, parameter-free: the region selective recompute checkpoints."""

    def __init__(self, head_dim: int, use_rope: bool) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.use_rope = use_rope

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # Head counts come from the local widths, so the same code runs whole or tensor-parallel.
        q, k, v = (t.unflatten(-1, (-1, self.head_dim)) for t in (q, k, v))
        if self.use_rope:
            q, k = rotary(q), rotary(k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])
        return out.transpose(1, 2).flatten(-2)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, kv = spec.hidden_size, spec.kv_hidden_size
        self.q_proj = nn.Linear(h, h, bias=spec.bias)
        self.k_proj = nn.Linear(h, kv, bias=spec.bias)
        self.v_proj = nn.Linear(h, kv, bias=spec.bias)
        self.core = AttentionCore(spec.head_dim, use_rope=not spec.learned_positions)
        self.o_proj = nn.Linear(h, h, bias=spec.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o_proj(self.core(self.q_proj(x), self.k_proj(x), self.v_proj(x)))


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec, ffn: int | None = None) -> None:
        """``ffn``: the width (default ``spec.ffn_hidden_size``; an MoE layer's shared expert is narrower)."""
        super().__init__()
        h, f = spec.hidden_size, ffn or spec.ffn_hidden_size
        self.gated = spec.gated_mlp
        self.gate_proj = nn.Linear(h, f, bias=spec.bias) if self.gated else None
        self.up_proj = nn.Linear(h, f, bias=spec.bias)
        self.down_proj = nn.Linear(f, h, bias=spec.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_proj is not None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(F.gelu(self.up_proj(x), approximate="tanh"))


def make_mlp(spec: ModelSpec, layer: int, aux_loss_coef: float = 0.0) -> nn.Module:
    """The dense MLP, or on the layers ``spec.moe_layers`` names an ``MoE`` (with its shared expert)."""
    if layer not in spec.moe_layers:
        return MLP(spec)
    shared = MLP(spec, spec.shared_ffn_hidden_size) if spec.shared_ffn_hidden_size else None
    return MoE(spec, shared, aux_loss_coef)


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, spec: ModelSpec, layer: int = 0, aux_loss_coef: float = 0.0) -> None:
        super().__init__()
        self.input_layernorm = make_norm(spec)
        self.self_attn = Attention(spec)
        self.post_attention_layernorm = make_norm(spec)
        self.mlp = make_mlp(spec, layer, aux_loss_coef)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    """Decoder-only LM. ``layers`` is a ModuleDict keyed ``"0".."L-1"`` so that a pipeline stage can
    delete the blocks it does not own (and the embedding / head) and keep the others' names."""

    def __init__(self, spec: ModelSpec, aux_loss_coef: float = 0.0) -> None:
        """``aux_loss_coef``: weight of the MoE layers' load-balancing loss (0: none; ``moe.MoE``)."""
        super().__init__()
        self.spec = spec
        self.position_offset = 0
        """Position of ``tokens[:, 0]`` in its sequence: a sequence-parallel rank holds a later slice."""
        self.embed_tokens: nn.Embedding | None = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.embed_positions: nn.Embedding | None = (
            nn.Embedding(spec.max_seq_len, spec.hidden_size) if spec.learned_positions else None
        )
        self.layers = nn.ModuleDict({str(i): Block(spec, i, aux_loss_coef) for i in range(spec.num_layers)})
        self.norm: nn.Module | None = make_norm(spec)
        self.lm_head: nn.Linear | None = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        if spec.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        assert self.embed_tokens is not None
        h = self.embed_tokens(tokens)
        if self.embed_positions is not None:
            start = self.position_offset
            h = h + self.embed_positions(torch.arange(start, start + tokens.shape[1], device=tokens.device))
        return h

    def head(self, h: torch.Tensor) -> torch.Tensor:
        assert self.norm is not None and self.lm_head is not None
        return self.lm_head(self.norm(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids in (first stage) or hidden states in (later stages); logits or hidden states out."""
        h = self.embed(x) if self.embed_tokens is not None else x
        for block in self.layers.values():
            h = block(h)
        return self.head(h) if self.lm_head is not None else h


def _param_generator(seed: int, name: str, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return g


@torch.no_grad()
def init_weights(model: nn.Module, *, seed: int) -> None:
    """Normal(0, 0.02) for matrices and embeddings (output projections scaled by 1/sqrt(2L), GPT-2),
    zeros for biases, ones for norms. Names are read through wrappers (checkpoint, FSDP, DeepSpeed)."""
    num_layers = getattr(getattr(model, "spec", None), "num_layers", None)
    torch.manual_seed(seed)  # only DTensor parameters draw from the global RNG
    for name, p in model.named_parameters():
        clean = name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")
        if clean.endswith("bias"):
            p.zero_()
        elif p.ndim == 1:  # the only 1-D weights are norm scales
            p.fill_(1.0)
        else:
            std = _INIT_STD
            if num_layers and clean.endswith(("o_proj.weight", "down_proj.weight", "experts.down_proj")):
                std /= math.sqrt(2 * num_layers)
            if type(p.data).__name__ == "DTensor":
                nn.init.normal_(p, std=std)
            else:
                p.normal_(0.0, std, generator=_param_generator(seed, clean, p.device))


def build_model(
    spec: ModelSpec, *, device: torch.device | str, seed: int | None, aux_loss_coef: float = 0.0
) -> Transformer:
    """The full model on ``device`` (initialised from ``seed``), or on ``meta`` when ``seed`` is None
    (to be sharded first, then ``to_empty`` + ``init_weights``)."""
    if seed is None:
        with torch.device("meta"):
            return Transformer(spec, aux_loss_coef)
    with torch.device(device):
        model = Transformer(spec, aux_loss_coef)
    init_weights(model, seed=seed)
    return model


def synthetic_batch(
    spec: ModelSpec,
    *,
    batch: int,
    seq_len: int,
    step: int,
    seed: int,
    rows: slice | None = None,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``rows`` of the global batch of ``step``: ``(inputs, targets)`` of shape ``[rows, seq_len]``.

    Each sequence counts up by a random stride from a random start (mod vocab), so the loss falls
    step by step: a layout that computes the wrong update shows up as a different loss curve. The
    per-sequence draws cover the whole global batch on the CPU, so every layout sees the same data.
    """
    g = torch.Generator().manual_seed(seed * 7919 + step)
    start = torch.randint(spec.vocab_size, (batch, 1), generator=g)
    stride = torch.randint(1, 4, (batch, 1), generator=g)
    if rows is not None:
        start, stride = start[rows], stride[rows]
    tokens = ((start + stride * torch.arange(seq_len + 1)) % spec.vocab_size).to(device)
    return tokens[:, :-1], tokens[:, 1:]


def model_flops_per_token(spec: ModelSpec, seq_len: int) -> float:
    """Training FLOPs per token: 6 x (non-embedding + output) parameters a token passes through (an MoE
    layer's top-k experts, not all of them: ``ModelSpec.active_params``), plus causal attention's score and
    value products, 6 x L x h x s (PaLM, Chowdhery et al. 2022 App. B, halved for causal)."""
    idle_experts = spec.num_params - spec.active_params
    matmul_params = (
        spec.num_layers * spec.params_per_layer - idle_experts + spec.vocab_size * spec.hidden_size
    )
    return 6.0 * matmul_params + 6.0 * spec.num_layers * spec.hidden_size * seq_len
