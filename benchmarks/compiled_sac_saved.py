"""What one Llama block keeps for backward under torchtitan's per-op selective AC, eager vs ``torch.compile``
(CPU, Inductor).

torchtitan's op SAC (``_apply_op_sac`` in torchtitan/distributed/activation_checkpoint.py, save list in
torchtitan/models/llama3/infra/parallelize.py) marks the outputs of ``aten.mm`` (except every second one of
the block), of SDPA and of ``max`` MUST_SAVE and everything else PREFER_RECOMPUTE. In eager mode the
checkpoint stores every MUST_SAVE output; under ``torch.compile`` AOTAutograd's partitioner keeps only what
the backward reads, with MUST_SAVE deciding between saving and recomputing. This benchmark records, for one
block (RMSNorm, GQA attention with RoPE, SwiGLU MLP, as torchtitan's Llama 3), the tensors autograd saves
(``torch.autograd.graph.saved_tensors_hooks``, distinct storages, the block's own weights left out) in both
modes, classifies them by width (hidden, K/V, FFN, log-sum-exp), and writes
benchmarks/results/compiled_sac_saved.json, which ``costmodel.activations.op_sac_bytes`` cites.

On CPU, SDPA runs ``aten._scaled_dot_product_flash_attention_for_cpu``; it takes the place of the CUDA
flash / efficient ops in the save list.

Usage:  python benchmarks/compiled_sac_saved.py
"""

from __future__ import annotations

import json
from collections import defaultdict
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

OUT = Path(__file__).resolve().parent / "results" / "compiled_sac_saved.json"
B, S, H, HEADS, KV_HEADS, FFN = 1, 256, 512, 8, 2, 1408
HEAD_DIM = H // HEADS
KV = KV_HEADS * HEAD_DIM

SAVE_LIST = {
    torch.ops.aten.mm.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten.max.default,
}


def _policy(meta: dict[str, int], ctx, func, *args, **kwargs) -> CheckpointPolicy:
    """torchtitan's op-SAC policy: save listed ops, except every second ``mm`` of the block."""
    key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
    if func == torch.ops.aten.mm.default:
        meta[key] += 1
    save = func in SAVE_LIST and not (func == torch.ops.aten.mm.default and meta[key] % 2 == 0)
    return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE


_MODES: list = []
"""The eager checkpoint's caching modes: SAC keeps MUST_SAVE outputs in the mode's own ``storage``, which
``saved_tensors_hooks`` does not see."""


def _context():
    contexts = create_selective_checkpoint_contexts(partial(_policy, defaultdict(int)))
    _MODES.append(contexts[0])
    return contexts


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : HEAD_DIM // 2], x[..., HEAD_DIM // 2 :]
    cos, sin = cos[:, None, :], sin[:, None, :]  # [S, 1, d/2] against [B, S, heads, d/2]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Block(nn.Module):
    """torchtitan's Llama 3 block: q, k, v, o then w1 (gate), w3 (up), w2 (down), in that order."""

    def __init__(self) -> None:
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(H), nn.RMSNorm(H)
        self.wq, self.wk = nn.Linear(H, H, bias=False), nn.Linear(H, KV, bias=False)
        self.wv, self.wo = nn.Linear(H, KV, bias=False), nn.Linear(H, H, bias=False)
        self.w1, self.w3 = nn.Linear(H, FFN, bias=False), nn.Linear(H, FFN, bias=False)
        self.w2 = nn.Linear(FFN, H, bias=False)
        angle = torch.arange(S)[:, None] / 10000 ** (torch.arange(HEAD_DIM // 2) / (HEAD_DIM // 2))
        self.register_buffer("cos", angle.cos(), persistent=False)
        self.register_buffer("sin", angle.sin(), persistent=False)

    def _inner(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attention_norm(x)
        q = self.wq(h).view(B, S, HEADS, HEAD_DIM)
        k = self.wk(h).view(B, S, KV_HEADS, HEAD_DIM)
        v = self.wv(h).view(B, S, KV_HEADS, HEAD_DIM)
        q, k = _rope(q, self.cos, self.sin), _rope(k, self.cos, self.sin)
        rep = HEADS // KV_HEADS  # torchtitan's repeat_kv before SDPA
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.wo(out.transpose(1, 2).reshape(B, S, H))
        g = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(g)) * self.w3(g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self._inner, x, use_reentrant=False, context_fn=_context, preserve_rng_state=False)


def _references(block: Block, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each projection's output and the block input, from a plain forward, to name what was saved."""
    refs: dict[str, torch.Tensor] = {"block input": x.detach()}
    hooks = [
        getattr(block, n).register_forward_hook(lambda m, a, out, n=n: refs.__setitem__(n, out.detach()))
        for n in ("wq", "wk", "wv", "wo", "w1", "w3", "w2")
    ]
    with torch.no_grad():
        block._inner(x)
    for h in hooks:
        h.remove()
    return refs


def _name(t: torch.Tensor, refs: dict[str, torch.Tensor]) -> str:
    for name, ref in refs.items():
        if ref.numel() == t.numel() and torch.allclose(ref.reshape(-1), t.detach().reshape(-1), atol=1e-4):
            return name
    return "attention output" if t.dim() == 4 else ("log-sum-exp" if t.dim() == 3 else "?")


def _kind(t: torch.Tensor) -> str:
    n = t.numel()
    if n == B * S * H:
        return "hidden"
    if n == B * S * KV:
        return "kv"
    if n == B * S * FFN:
        return "ffn"
    if n == B * HEADS * S:
        return "logsumexp"
    return f"other {list(t.shape)}"


def saved(block: nn.Module, fn, *, eager: bool) -> list[dict]:
    """Activation tensors (distinct storages, not the block's parameters or buffers) saved in forward:
    what autograd saves, and in eager mode also what SAC stashed (under compile its modes only trace)."""
    own = {p.untyped_storage().data_ptr() for p in [*block.parameters(), *block.buffers()]}
    found: dict[int, dict] = {}
    torch.manual_seed(0)
    refs = _references(block, torch.randn(B, S, H))

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.numel() < B * HEADS * S:
            return t
        ptr = t.untyped_storage().data_ptr()
        if ptr not in own:
            name = _name(t, refs)
            found[ptr] = {"kind": _kind(t), "name": name, "shape": list(t.shape), "dtype": str(t.dtype)}
        return t

    torch.manual_seed(0)
    x = torch.randn(B, S, H, requires_grad=True)
    _MODES.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = fn(x)
    for mode in _MODES if eager else []:  # eager SAC's stash; under compile the partitioner decides
        for outputs in mode.storage.values():  # per op: call index -> outputs kept, or a recompute marker
            for item in outputs.values() if isinstance(outputs, dict) else outputs:
                for leaf in torch.utils._pytree.tree_leaves(item):
                    value = getattr(leaf, "val", leaf)  # torch.utils.checkpoint._VersionWrapper
                    if isinstance(value, torch.Tensor):
                        pack(value)
    y.sum().backward()
    return sorted(found.values(), key=lambda d: d["kind"])


def _summary(rows: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for r in rows:
        counts[r["kind"]] += 1
    return dict(sorted(counts.items()))


def main() -> int:
    torch.manual_seed(0)
    block = Block()
    eager = saved(block, block, eager=True)
    compiled = saved(block, torch.compile(block, fullgraph=True), eager=False)
    result = {
        "torch": torch.__version__,
        "shape": {"batch": B, "seq": S, "hidden": H, "heads": HEADS, "kv_heads": KV_HEADS, "ffn": FFN},
        "eager": {"counts": _summary(eager), "saved": eager},
        "compiled": {"counts": _summary(compiled), "saved": compiled},
    }
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v["counts"] for k, v in result.items() if isinstance(v, dict) and "counts" in v}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
