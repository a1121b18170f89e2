"""What torchtitan's cross-entropy keeps for backward, eager vs ``torch.compile`` (CPU, Inductor).

torchtitan's loss is ``F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))`` on bf16 logits
(torchtitan/components/loss.py); with compile on it is ``torch.compile``d (since torchtitan bbb1b616e).
This records the logit-sized tensors autograd saves (``torch.autograd.graph.saved_tensors_hooks``) and,
for the compiled function, the logit-sized buffers Inductor's generated code allocates (forward and
backward), and writes them to benchmarks/results/compiled_loss_saved.json. ``costmodel.activations``
``loss_stored_bytes`` / ``loss_transient_bytes`` cite it.

Usage:  python benchmarks/compiled_loss_saved.py
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from torch._inductor.utils import run_and_get_code

OUT = Path(__file__).resolve().parent / "results" / "compiled_loss_saved.json"
B, S, V = 1, 512, 32000


def _loss(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


def _saved(fn) -> tuple[list[dict], list[str]]:
    """Logit-sized saved tensors (distinct storages) and the generated code of forward + backward."""
    torch.manual_seed(0)
    pred = torch.randn(B, S, V, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, V, (B, S))
    saved: dict[int, dict] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.numel() >= B * S * V:
            saved[t.untyped_storage().data_ptr()] = {
                "shape": list(t.shape),
                "dtype": str(t.dtype),
                "bytes_per_logit": t.element_size(),
            }
        return t

    def step() -> None:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = fn(pred * 1.0, labels)
        loss.backward()

    if fn is _loss:
        step()
        return list(saved.values()), []
    _, code = run_and_get_code(step)
    return list(saved.values()), code


def main() -> int:
    eager, _ = _saved(_loss)
    compiled, code = _saved(torch.compile(_loss))
    shape = re.compile(rf"empty_strided\w*\(\((?:1, )?{S}, {V}\)[^)]*\), (torch\.\w+)\)")
    buffers = [m.group(1) for c in code for m in shape.finditer(c)]
    result = {
        "torch": torch.__version__,
        "logits": [B, S, V],
        "eager_saved": eager,
        "compiled_saved": compiled,
        "compiled_logit_sized_buffers_allocated": buffers,
    }
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
