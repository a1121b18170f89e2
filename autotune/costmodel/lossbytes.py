"""HBM traffic of the LM head's loss per token and vocabulary entry, by the cross-entropy a framework runs.

Convention: bytes per logit for one micro-batch's forward + backward, on the rank's ``V / vocab_split``
slice, excluding the LM head GEMMs themselves (``compute.head_gemm_s``). Read + write of each kernel's
operands, as in ``flops.elementwise_bytes_per_token``.
"""

from __future__ import annotations

from autotune.costmodel.flops import LOGITS_BYTES_PER_VOCAB
from autotune.plan import Framework, LossKernel, ParallelPlan

__all__ = ["MEGATRON_LOSS_BYTES_PER_VOCAB", "TE_LOSS_BYTES_PER_VOCAB", "loss_bytes_per_vocab"]

MEGATRON_LOSS_BYTES_PER_VOCAB = 54
"""Megatron-Core's vocab-parallel cross-entropy, unfused (megatron/core/tensor_parallel/cross_entropy.py
``_VocabParallelCrossEntropy``; Megatron-LM's ``--cross-entropy-loss-fusion`` is off by default), one kernel
per line, fp32 on the ``[s, b, V/tp]`` logits: the head GEMM writes bf16 logits (2); forward
``calculate_logits_max``: ``.float()`` (read 2, write 4) and ``torch.max`` (read 4);
``calculate_predicted_logits``: in-place ``-= logits_max`` (read 4, write 4), ``torch.exp(out=)`` (4 + 4) and
``sum`` (read 4); ``calculate_cross_entropy_loss``: ``exp_logits.div_`` (4 + 4); backward
``calculate_gradients``: the target scatter (one entry per token) and ``grad_input.mul_`` (4 + 4), then
autograd's cast of the fp32 gradient back to the bf16 logits' dtype for the head's backward GEMMs (read 4,
write 2). Total 40 forward + 14 backward. The fused variant (megatron/core/fusions/fused_cross_entropy.py,
``jit_fuser``) merges the cast with the max and the subtraction with the exp: 42, not distinguished here."""


TE_LOSS_BYTES_PER_VOCAB = 12
"""Transformer Engine's ``parallel_cross_entropy`` (``plan.loss_kernel`` fused under Megatron) as TE
v2.5-v2.17 run it (transformer_engine/common/triton/cross_entropy.py at v2.17.1, pytorch/triton/ before
v2.10): the head GEMM writes bf16 logits (2); ``online_softmax_kernel`` reads them for the running max and sum
(2); ``cross_entropy_kernel`` reads them (2) and writes the gradient into them (2); backward
``element_mul_kernel`` scales it in place by the per-token loss gradient Megatron passes (read 2, write 2).
Total 8 forward + 4 backward. TE v2.18 (01bbe3eea, 2026-07) keeps an fp32 gradient instead (24 B and 4 B kept
per logit), not priced here; Megatron-LM core_v0.19 refuses the TE loss."""


def loss_bytes_per_vocab(plan: ParallelPlan) -> float:
    """Bytes per token and vocabulary entry of the loss: Megatron's eager fp32 cross-entropy
    (``MEGATRON_LOSS_BYTES_PER_VOCAB``) or Transformer Engine's (``TE_LOSS_BYTES_PER_VOCAB``); other
    frameworks the fused count ``flops.LOGITS_BYTES_PER_VOCAB`` (a compiled torch loss or a fused kernel:
    logits written, softmax read and written, gradient written)."""
    if plan.framework is Framework.MEGATRON:
        te = plan.loss_kernel is LossKernel.FUSED
        return float(TE_LOSS_BYTES_PER_VOCAB if te else MEGATRON_LOSS_BYTES_PER_VOCAB)
    return float(LOGITS_BYTES_PER_VOCAB)
