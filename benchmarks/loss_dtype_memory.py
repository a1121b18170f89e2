"""Peak memory of an eager cross-entropy on bf16 logits, upcast to fp32 first or not (CPU, MemTracker).

torchtitan's loss is ``F.cross_entropy(pred.float(), labels)``; NeMo AutoModel's benchmark recipes set
``MaskedCrossEntropy(fp32_upcast=False)``, i.e. ``F.cross_entropy(pred, labels)`` on the bf16 logits
(``plan.loss_kernel`` bf16). This runs both, forward and backward, under
``torch.distributed._tools.mem_tracker.MemTracker`` and records the peak bytes per logit beyond the incoming
logits themselves: what autograd keeps (``ACT``) and the backward's temporaries (``TEMP``). The cost model's
``activations.loss_stored_bytes`` + ``loss_transient_bytes`` are checked against ``measure()`` by
tests/costmodel/test_store_dtypes.py; the figures are written to benchmarks/results/loss_dtype_memory.json.

Usage:  python benchmarks/loss_dtype_memory.py
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.distributed._tools.mem_tracker import MemTracker

OUT = Path(__file__).resolve().parent / "results" / "loss_dtype_memory.json"
TOKENS, VOCAB = 512, 32000


def measure(upcast: bool, tokens: int = TOKENS, vocab: int = VOCAB) -> dict[str, float]:
    """Peak bytes per logit of one eager loss forward + backward, by MemTracker category."""
    torch.manual_seed(0)
    pred = torch.randn(tokens, vocab, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (tokens,))
    tracker = MemTracker()
    tracker.track_external(pred)
    with tracker:
        logits = pred * 1.0  # the head's output: freed once the loss has read it, as in a model
        loss = F.cross_entropy(logits.float() if upcast else logits, labels)
        del logits
        loss.backward()
    peak = {
        str(k).rsplit(".", 1)[-1]: v
        for cats in tracker.get_tracker_snapshot("peak").values()
        for k, v in cats.items()
    }
    per_logit = {k: v / (tokens * vocab) for k, v in peak.items() if v}
    per_logit["loss"] = per_logit.get("ACT", 0.0) + per_logit.get("TEMP", 0.0)
    return per_logit


def main() -> int:
    result = {
        "torch": torch.__version__,
        "logits": [TOKENS, VOCAB],
        "fp32_upcast": measure(True),
        "bf16": measure(False),
    }
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
