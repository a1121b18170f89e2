"""Memory of the LM loss on the last stage: what the cross-entropy keeps for backward per micro-batch
(``loss_stored_bytes``) and the buffers that come and go around it (``loss_transient_bytes``), by the kernel
the framework or the user's script runs (``activations.Kernels``: eager fp32 or bf16, fused, compiled,
torch's ``loss_parallel``, Megatron's vocab-parallel fused loss, a chunked linear + cross-entropy)."""

from __future__ import annotations

import math

from autotune.costmodel.activations import Kernels, LayerShape

__all__ = ["liger_chunk_tokens", "loss_stored_bytes", "loss_transient_bytes"]


def liger_chunk_tokens(tokens: float, h: int, vocab: int) -> float:
    """Rows of one logits chunk in Liger's fused linear cross-entropy (liger_kernel/ops/
    fused_linear_cross_entropy.py: ``inc_factor = cdiv(V, H)``, ``chunk_size = next_power_of_2(cdiv(BT,
    inc_factor))``): about ``BT x H`` logits at once, never ``BT x V``."""
    rows = math.ceil(tokens / math.ceil(vocab / h))
    return float(min(2 ** math.ceil(math.log2(max(rows, 1))), math.ceil(tokens)))


def loss_stored_bytes(x: LayerShape, *, tp: int, e: int = 2, k: Kernels | None = None) -> float:
    """Kept for the loss's backward per micro-batch on the last stage (Korthikanti Sec. 4.3: the
    cross-entropy works on fp32 logits): the fp32 (log-)softmax, 4 B per logit, vocab split by ``t``. The
    logits themselves are saved by no op (the cast to fp32 and the log-softmax keep only outputs). A
    compiled loss (``Kernels.compiled_loss``) keeps the ``e``-byte logits instead, recomputing the softmax
    in backward: measured with ``saved_tensors_hooks`` (benchmarks/compiled_loss_saved.py: eager keeps one
    fp32 logit-sized tensor, 4 B per logit; compiled the bf16 input, 2 B). A bf16 loss keeps its bf16
    log-softmax (``Kernels.loss_bytes``)."""
    if k is None:
        return x.s * x.b * x.vocab / tp * 4.0
    if k.te_cross_entropy:  # the bf16 logits, its backward's output (``Kernels.te_cross_entropy``)
        return x.s * x.b * x.vocab / tp * e
    if k.chunked_loss:  # the head's weight gradient, made in forward (its input gradient replaces its input)
        return x.vocab * x.h / tp * e
    per_logit = float(e) if k.compiled_loss else float(k.loss_bytes)
    return x.s * x.b * x.vocab / tp * per_logit


def loss_transient_bytes(x: LayerShape, *, tp: int, e: int, k: Kernels) -> float:
    """Loss buffers that come and go around the stored softmax. Eager ``F.cross_entropy`` holds the fp32
    gradients of the log-softmax output and of its input at once in backward (8 B per logit; the CPU
    cross-check's peak), more than the forward's ``e``-byte logits + fp32 copy. Megatron's fused
    vocab-parallel cross-entropy writes its gradient in place: only the logits (``e``) while the fp32
    buffer is made; so does a compiled loss (its backward allocates one ``e``-byte logit-sized buffer, the
    generated code in benchmarks/compiled_loss_saved.py). torch's ``loss_parallel``
    (torch/distributed/tensor/parallel/loss.py ``_nll_loss_and_log_softmax_backward``) holds, beside the
    saved log-softmax, ``zeros_like(x)``, ``exp(x)`` and their sum, then the product with the incoming
    gradient: 12 B per logit. A bf16 loss (``Kernels.loss_bytes`` 2) holds the same buffers in bf16."""
    b = k.loss_bytes
    if k.te_cross_entropy:  # the gradient is written into the saved logits
        return 0.0
    if k.chunked_loss:  # one chunk of logits, in place (``liger_chunk_tokens``)
        return liger_chunk_tokens(x.s * x.b, x.h, x.vocab) * x.vocab / tp * e
    if k.fused_cross_entropy or k.compiled_loss:  # compiled: the one e-byte gradient buffer Inductor writes
        per_logit = float(e)
    else:
        per_logit = 3.0 * b if k.loss_parallel else max(2.0 * b, e + b)
    return x.s * x.b * x.vocab / tp * per_logit
